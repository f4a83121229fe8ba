"""`swarm run --project PATH`: the coding team on a copy of the user's project.

`CodingTeam` makes the private copy, the sandbox and the toolbox, and builds the
agents (agents.planner, agents.fixer, agents.patch_reviewer, agents.test_author)
for a `SessionRunner` to run. `finish` afterwards puts the verified fixes
together, tests them together, writes `<out>/report.md` and `<out>/patches/`,
takes the worktree out of the user's repository and, with `--apply`, writes the
result into the user's tree.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from agents.fixer import Fixer
from agents.patch_reviewer import PatchReviewer
from agents.planner import Planner
from agents.test_author import TestAuthor
from runtime.errors import ConfigError
from runtime.events.files import private_dir, write_private
from swarm.coding.patches import Judgement, apply_in, make_diff, patch_files
from swarm.coding.project import ProjectCopy, apply_patch
from swarm.coding.sandbox import Sandbox, describe_sandbox
from swarm.coding.testing import command_line, detect_runner
from swarm.coding.tools import Toolbox


class CodingTeam:
    def __init__(
        self,
        project: str | Path,
        out: Path,
        *,
        test_cmd: str | None = None,
        fixers: int = 2,
        candidates: int = 4,
        temperature: float = 0.8,
        rounds: int | None = None,
        fixer_tokens: int = 320,
        reviewer: bool = True,
        tester: bool = True,
        script: Sequence[str] | None = None,
        interactive: bool = False,
        interval_s: float = 0.0,
        say: Callable[[str], None] | None = None,
        sandbox: Sandbox | None = None,
        worktree: bool = True,
    ) -> None:
        self.out = Path(out)
        self.copy = ProjectCopy.create(project, self.out, worktree=worktree)
        try:
            self.runner = detect_runner(self.copy.copy, test_cmd)
        except Exception:
            self.copy.close()
            raise
        self.sandbox = sandbox or Sandbox()
        self.tools = Toolbox(self.copy, self.runner, self.sandbox, self.out / "scratch")
        names = [f"fixer-{i + 1}" for i in range(fixers)]
        self.fixers = [
            Fixer(n, tools=self.tools, candidates=candidates, temperature=temperature, rounds=rounds, max_tokens=fixer_tokens)
            for n in names
        ]
        self.reviewer = PatchReviewer("reviewer", tools=self.tools) if reviewer else None
        self.tester = TestAuthor("tester", tools=self.tools) if tester else None
        self.planner = Planner(
            "planner",
            tools=self.tools,
            fixers=names,
            reviewer="reviewer" if reviewer else None,
            tester="tester" if tester else None,
            script=script,
            interactive=interactive,
            interval_s=interval_s,
            say=say,
        )
        self.agents: list[Any] = [*self.fixers, *filter(None, (self.reviewer, self.tester)), self.planner]
        self.final: Judgement | None = None
        self.applied: list[str] = []

    def finish(self, *, apply: bool = False, model: str = "") -> Path:
        """Combine, test, write the report and patches; apply if asked. Returns the report's path."""
        try:
            patches = private_dir(self.out / "patches")
            winners = self.winners()
            for i, (test, diff) in enumerate(winners, 1):
                write_private(patches / f"{i:02d}-{_slug(test)}.patch", diff)
            new_tests = [t.diff for t in self.planner.new_tests.values() if t.ran and t.diff]
            for i, diff in enumerate(new_tests, 1):
                write_private(patches / f"tests-{i:02d}.patch", diff)
            combined = ""
            if winners:
                for extra in (new_tests, []):
                    combined = self.combine([d for _, d in winners] + extra)
                    # Judged on what the fixes fixed: a failure no fix was found for still fails.
                    fixed = sorted({t for test, _ in winners for t in self.planner.results[test].fixed} or {t for t, _ in winners})
                    self.final = anyio.run(self.tools.propose_patch, combined, fixed) if combined else None
                    if self.final is not None and self.final.verified:
                        break
                if combined:
                    write_private(patches / "combined.patch", combined)
            report = self.out / "report.md"
            write_private(report, self.report(model, winners))
            if apply:
                if not (combined and self.final is not None and self.final.verified):
                    raise ConfigError("--apply: no verified fix to apply; the project is unchanged")
                self.applied = apply_patch(self.copy.source, combined)  # refuses a dirty tree, saying what it would do
                write_private(report, self.report(model, winners))
            return report
        finally:
            self.copy.close()

    def winners(self) -> list[tuple[str, str]]:
        """Each verified fix once, in the order of the failures."""
        seen, out = set(), []
        for failure in self.planner.failures:
            result = self.planner.results.get(failure.test)
            if result is not None and result.verified and result.diff not in seen:
                seen.add(result.diff)
                out.append((failure.test, result.diff))
        return out

    def combine(self, diffs: list[str]) -> str:
        """The diffs applied one after another to a scratch copy, as one diff;
        one that no longer applies on top of the others is left out."""
        tree = self.out / "scratch" / "combined"
        shutil.rmtree(tree, ignore_errors=True)  # (a second try, without the new tests)
        self.copy.scratch(tree)
        files: list[str] = []
        for diff in diffs:
            if apply_in(tree, diff).ok:
                files += [f for f in patch_files(diff) if f not in files]
        parts = []
        for path in files:
            old_file, new_file = self.copy.copy / path, tree / path
            old = old_file.read_text(errors="replace") if old_file.is_file() else None
            new = new_file.read_text(errors="replace") if new_file.is_file() else ""
            if old is None:
                parts.append(make_diff(path, "", new).replace(f"--- a/{path}", "--- /dev/null", 1))
            elif old != new:
                parts.append(make_diff(path, old, new))
        return "".join(parts)

    def report(self, model: str, winners: list[tuple[str, str]]) -> str:
        p = self.planner
        before = p.baseline
        after = self.final.report.summary() if self.final and self.final.report else "no fix to test"
        lines = [
            "# Coding session report",
            "",
            f"- project: `{self.copy.source}` (the team worked on a private copy; the project's files were "
            f"{'written by --apply: ' + ', '.join(self.applied) if self.applied else 'not written'})",
            f"- tests: `{command_line(self.runner)}` in the sandbox: {describe_sandbox(self.sandbox.kind)}",
            f"- model: {model or 'default'}; {len(self.fixers)} fixer(s), "
            f"{self.fixers[0].candidates if self.fixers else 0} candidates a round each",
            f"- before: {before.summary() if before else 'the tests did not run'}",
            f"- after (every verified fix together): {after}",
            "",
        ]
        if before is not None and before.cut_off:
            lines += [f"The test run was cut off ({before.cut_off}); its output ends:", "", "```", before.output_tail[-1500:], "```", ""]
        for failure in p.failures:
            result = p.results.get(failure.test)
            lines += [f"## {failure.test}", "", "```", failure.message[-800:].strip(), "```", ""]
            if failure.test in p.covered and p.covered[failure.test] != failure.test:
                lines += [f"Fixed by the patch for {p.covered[failure.test]}.", ""]
            if result is None:
                lines += ["Not fixed: the session ended while its fixer worked on it.", ""]
                continue
            took = f"{result.candidates} candidate(s) in {result.rounds} round(s), {result.tokens} tokens decoded, {result.seconds:.0f} s"
            if not result.verified:
                lines += [f"Not fixed by {result.fixer} after {took}. Last: {result.note[:500]}", ""]
                continue
            lines += [
                f"Fixed and verified by {result.fixer} after {took}. It fixes: {', '.join(result.fixed)}.",
                "",
                "```diff",
                result.diff.rstrip(),
                "```",
                "",
            ]
            if failure.test in p.reviews:
                review = p.reviews[failure.test]
                lines += [f"Review ({'approved' if review.approved else 'rejected'}): {review.text[:400]}", ""]
            if failure.test in p.new_tests:
                new = p.new_tests[failure.test]
                lines += (
                    ["New test (runs and passes with the fix):", "", "```diff", new.diff.rstrip(), "```", ""]
                    if new.ran
                    else [f"New test: none that runs ({new.note[:300]})", ""]
                )
        if p.answers:
            lines += ["## Questions", ""] + [f"- **{q}**: {a}" for q, a in p.answers] + [""]
        lines += [
            f"Patches: `{self.out / 'patches'}` ({len(winners)} verified fix(es){', combined.patch all of them' if winners else ''})."
        ]
        return "\n".join(lines) + "\n"


def _slug(test: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in test.split("::")[-1])[:50]
