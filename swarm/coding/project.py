"""The user's project and the team's private copy of it.

`ProjectCopy.create(source, out)` gives the team a copy under the run's output
folder: a git worktree (detached at HEAD, with the user's uncommitted changes and
untracked files laid over it, so the team sees the tree as the user has it) where
`source` is in a git repository, else a plain copy. The user's files are only
read. Each test run gets its own scratch copy of that copy (`scratch`), so runs
never see each other's edits.

`apply_patch` is `--apply`: it writes a verified patch into the user's tree, and
refuses a dirty git tree, saying which files are dirty and what it would do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import ConfigError, SlotswarmError

IGNORED = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", "*.pyc")


def git(
    args: list[str], cwd: Path, *, input: str | None = None, check: bool = True, ceiling: Path | None = None
) -> subprocess.CompletedProcess:
    """git with a fixed identity and, given `ceiling`, no repository looked for
    above it (so `git apply` in a scratch copy inside another repository patches
    that copy, as plain patch would)."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    if ceiling is not None:
        env["GIT_CEILING_DIRECTORIES"] = str(ceiling)
    result = subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise SlotswarmError(f"git {' '.join(args[:2])} in {cwd}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def git_root(path: Path) -> Path | None:
    if shutil.which("git") is None:
        return None
    result = git(["rev-parse", "--show-toplevel"], path, check=False)
    return Path(result.stdout.strip()).resolve() if result.returncode == 0 else None


@dataclass
class ProjectCopy:
    source: Path  # the user's project folder
    copy: Path  # the team's copy of it
    repo: Path | None  # the user's git repository, where there is one
    worktree: Path | None  # the worktree made in it (removed by close)

    @classmethod
    def create(cls, source: str | Path, out: Path, *, worktree: bool = True) -> ProjectCopy:
        """`worktree=False` copies even from a git repository (the built-in sample
        project lives in slotswarm's own)."""
        source = Path(source).expanduser().resolve()
        if not source.is_dir():
            raise ConfigError(f"--project {str(source)!r} does not exist or is not a folder")
        repo = git_root(source) if worktree else None
        if repo is None:
            copy = out / "project"
            shutil.copytree(source, copy, ignore=IGNORED, symlinks=True)
            return cls(source, copy, None, None)
        worktree = out / "worktree"
        git(["worktree", "add", "--detach", "--quiet", str(worktree), "HEAD"], repo)
        # The tree as the user has it: uncommitted changes, then untracked files.
        diff = git(["diff", "--binary", "HEAD"], repo).stdout
        if diff.strip():
            git(["apply", "--binary", "--whitespace=nowarn"], worktree, input=diff)
        untracked = git(["ls-files", "--others", "--exclude-standard", "-z"], repo).stdout.split("\0")
        for rel in filter(None, untracked):
            target = worktree / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, target, follow_symlinks=False)
        return cls(source, worktree / source.relative_to(repo), repo, worktree)

    def scratch(self, into: Path) -> Path:
        """A fresh copy of the team's copy at `into` (no .git: a plain folder)."""
        shutil.copytree(self.copy, into, ignore=IGNORED, symlinks=True)
        return into

    def close(self) -> None:
        """Take the worktree out of the user's repository again (its files go;
        the patches and report stay in the output folder)."""
        if self.worktree is not None and self.repo is not None:
            git(["worktree", "remove", "--force", str(self.worktree)], self.repo, check=False)
            git(["worktree", "prune"], self.repo, check=False)
            self.worktree = None


def dirty_files(source: Path) -> list[str]:
    """The user's uncommitted and untracked files (git status), [] outside git."""
    repo = git_root(source)
    if repo is None:
        return []
    lines = git(["status", "--porcelain", "--", str(source)], repo).stdout.splitlines()
    return [line[3:] for line in lines if line.strip()]


def patch_files(patch: str) -> list[str]:
    """The files a unified diff changes (its +++ side, or --- for a deletion)."""
    files = []
    old = None
    for line in patch.splitlines():
        if line.startswith("--- "):
            old = _strip_prefix(line[4:])
        elif line.startswith("+++ "):
            new = _strip_prefix(line[4:])
            name = new if new != "/dev/null" else old
            if name and name not in files:
                files.append(name)
    return files


def _strip_prefix(name: str) -> str:
    name = name.split("\t")[0].strip()
    return name[2:] if name.startswith(("a/", "b/")) else name


def apply_patch(source: Path, patch: str) -> list[str]:
    """Write `patch` into the user's project (what --apply does). Refuses a
    dirty git tree, or a patch that does not apply, with what it would have done.
    Returns the files changed."""
    files = patch_files(patch)
    what = f"apply the verified patch to {len(files)} file(s): {', '.join(files)}"
    dirty = dirty_files(source)
    if dirty:
        raise ConfigError(
            f"--apply: {source} has uncommitted changes ({', '.join(dirty[:10])}{', ...' if len(dirty) > 10 else ''}); "
            f"nothing written. Commit or stash them and run again, or apply the patch yourself: it would {what}"
        )
    repo = git_root(source)
    where, extra = (repo, [f"--directory={source.relative_to(repo)}"] if source != repo else []) if repo else (source, [])
    check = git(["apply", "--check", *extra], where, input=patch, check=False, ceiling=None if repo else source.parent)
    if check.returncode != 0:
        from swarm.coding.patches import reanchor

        patch = reanchor(source, patch) or patch
        check = git(["apply", "--check", *extra], where, input=patch, check=False, ceiling=None if repo else source.parent)
    if check.returncode != 0:
        raise ConfigError(f"--apply: the patch no longer applies to {source}: {check.stderr.strip()}; nothing written")
    git(["apply", *extra], where, input=patch, ceiling=None if repo else source.parent)
    return files
