"""Patches: read out of a model's answer, checked, and verified by the tests.

A small model's answer is plain text. `read_proposal` takes from it, in order:
- a unified diff (a ```diff fence, or bare `--- a/... +++ b/...` lines);
- a fenced Python file or fragment for a known file: a fragment whose top-level
  functions and classes all exist in the file replaces just those; anything
  else that parses replaces the whole file. The diff is then made here (difflib),
  so the model never has to count lines.
Anything else is no proposal.

The team's agents do not leave that shape to chance: their answers are held to
`PYTHON_BLOCK` (runtime.agent: `regex=`), so every answer is exactly one fenced
Python block, no prose around it, and `code_block` takes its code out whole.
The code stays code: not escaped into a JSON string, which costs a small
model's code quality. `read_proposal` still reads a free answer (an engine that
cannot constrain, a person's paste).

`verify` applies a patch to its own scratch copy (`git apply --check` first) and
runs the tests there; `judge` ranks the results.
"""

from __future__ import annotations

import ast
import difflib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import msgspec

from swarm.coding.project import git, patch_files
from swarm.coding.testing import FAILED, TestReport

FENCE = re.compile(r"```[ \t]*([\w.+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
DIFF_START = re.compile(r"^(?:diff --git |--- )", re.M)
# One fenced Python block and nothing else: the code holds no ``` of its own
# (its last line may end in one or two backticks).
PYTHON_BLOCK = r"```python\n(?:[^`]|`[^`]|``[^`])*`{0,2}\n```"
_PYTHON_BLOCK = re.compile(PYTHON_BLOCK)


class Proposal(msgspec.Struct):
    """A candidate change as a unified diff against the team's copy."""

    diff: str
    source: str = "diff"  # "diff", "file" (a whole file) or "fragment" (functions replaced)


def read_proposal(answer: str, files: dict[str, str], default: str | None = None) -> Proposal | None:
    """The change an answer proposes, against `files` (path -> text), or None."""
    fences = [(lang.lower(), body) for lang, body in FENCE.findall(answer)]
    for lang, body in fences:
        if lang in ("diff", "patch") or DIFF_START.search(body) and "+++ " in body:
            diff = _clean_diff(body)
            if diff:
                return Proposal(diff, "diff")
    if not fences and "+++ " in answer and DIFF_START.search(answer):
        diff = _clean_diff(answer[DIFF_START.search(answer).start() :])
        if diff:
            return Proposal(diff, "diff")
    for lang, body in fences:
        if lang in ("", "py", "python", "python3") and (proposal := code_proposal(body, files, default, answer=answer)) is not None:
            return proposal
    return None


def code_proposal(code: str, files: dict[str, str], default: str | None = None, *, answer: str = "") -> Proposal | None:
    """The change Python `code` proposes (functions to replace, or a whole file),
    against `files`, or None. `answer`, the text around the code, may name its file."""
    for target in _targets(answer, code, files, default):
        new = splice(files[target], code)
        if new is not None and new != files[target]:
            return Proposal(make_diff(target, files[target], new), "fragment" if new != _ensure_newline(code.strip("\n")) else "file")
    # A bug across two files: each definition goes to the one file that has it.
    diffs = []
    for path, part in (_by_file(code, files) or {}).items():
        new = splice(files[path], part)
        if new is None:
            return None
        if new != files[path]:
            diffs.append(make_diff(path, files[path], new))
    return Proposal("".join(diffs), "fragment") if diffs else None


def _by_file(code: str, files: dict[str, str]) -> dict[str, str] | None:
    """`code`'s definitions grouped by the one file that defines each name, where
    they span two files or more; None if any is not a definition (imports aside)
    or is found in no file or in several."""
    code = textwrap.dedent(code.strip("\n")) + "\n"
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    lines = code.splitlines(keepends=True)
    homes = {path: _defined(text, methods=True) for path, text in files.items() if path.endswith(".py")}
    parts: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        where = [path for path, names in homes.items() if isinstance(node, DEFS) and node.name in names]
        if len(where) != 1:
            return None
        parts.setdefault(where[0], []).append("".join(lines[_first_line(node) : node.end_lineno]))
    return {path: "\n\n".join(chunks) for path, chunks in parts.items()} if len(parts) > 1 else None


def code_block(answer: str) -> str | None:
    """The code of an answer held to PYTHON_BLOCK, or None where it is not one
    (the answer ran out of tokens before its block closed)."""
    text = answer.strip()
    if not _PYTHON_BLOCK.fullmatch(text):
        return None
    return text[len("```python\n") : -len("```")]


def _targets(answer: str, body: str, files: dict[str, str], default: str | None) -> list[str]:
    """The files a fenced block may be for, likeliest first: those defining every
    function and class it defines, the one named before it, the default, the only one."""
    names = _defined(body)
    defining = [path for path, text in files.items() if names and names <= _defined(text, methods=True)]
    named = _named_file(answer, body, files)
    order = defining + [named, default] + (list(files) if len(files) == 1 else [])
    return list(dict.fromkeys(t for t in order if t is not None and t in files))


def _defined(code: str, methods: bool = False) -> set[str]:
    try:
        tree = ast.parse(textwrap.dedent(code))
    except SyntaxError:
        return set()
    return set(_slots(tree)) if methods else {n.name for n in tree.body if isinstance(n, DEFS)}


def make_diff(path: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), _ensure_newline(new).splitlines(keepends=True), f"a/{path}", f"b/{path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def splice(old: str, code: str) -> str | None:
    """`old` with `code` put in. Each top-level function or class of `code`
    replaces the definition of that name in `old`: a top-level one, else the one
    method of that name (re-indented to fit), and a class holding only some of
    its methods replaces just those. Code that defines what `old` does not, or
    more than definitions, is a whole new file when it keeps at least half of
    `old`'s top-level names. None if `code` is not Python or fits neither way."""
    code = textwrap.dedent(code.strip("\n")) + "\n"
    try:
        new_tree = ast.parse(code)
        old_tree = ast.parse(old)
    except SyntaxError:
        return None
    slots = _slots(old_tree)
    defs = [n for n in new_tree.body if isinstance(n, DEFS)]
    others = [n for n in new_tree.body if not isinstance(n, (*DEFS, ast.Import, ast.ImportFrom, ast.Expr))]
    new_lines = code.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []  # (start, end) of old lines, the lines put there
    for d in defs:
        edits += _edits_for(d, slots, new_lines, old_tree) or [(-1, -1, [])]
    if defs and not others and all(start >= 0 for start, _, _ in edits):
        old_lines = old.splitlines(keepends=True)
        for start, end, lines in sorted(edits, key=lambda e: e[0], reverse=True):  # bottom up: line numbers hold
            old_lines[start:end] = lines
        return "".join(old_lines)
    old_names = {n.name for n in old_tree.body if isinstance(n, DEFS)}
    if old_names and len(old_names & {d.name for d in defs}) * 2 < len(old_names):
        return None  # a fragment we cannot place, not a whole file
    return code


def _slots(tree: ast.Module) -> dict[str, list[ast.AST]]:
    """Where each name is defined: top-level definitions, then methods."""
    slots: dict[str, list[ast.AST]] = {}
    for node in tree.body:
        if isinstance(node, DEFS):
            slots.setdefault(node.name, []).insert(0, node)
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, DEFS):
                        slots.setdefault(member.name, []).append(member)
    return slots


def _edits_for(
    d: ast.AST, slots: dict[str, list[ast.AST]], new_lines: list[str], old_tree: ast.Module
) -> list[tuple[int, int, list[str]]] | None:
    places = slots.get(d.name, [])
    if not places:
        return None
    target = places[0]
    if isinstance(d, ast.ClassDef) and isinstance(target, ast.ClassDef):
        old_methods = {m.name for m in target.body if isinstance(m, DEFS)}
        new_methods = [m for m in d.body if isinstance(m, DEFS)]
        if new_methods and len(new_methods) < len(old_methods) and all(m.name in old_methods for m in new_methods):
            # Only some methods given: each replaces its namesake in this class.
            members = {m.name: m for m in target.body if isinstance(m, DEFS)}
            return [_edit(members[m.name], m, new_lines) for m in new_methods]
    if len(places) > 1 and target.col_offset > 0:
        return None  # a method name two classes share: no telling which
    return [_edit(target, d, new_lines)]


def _edit(old: ast.AST, new: ast.AST, new_lines: list[str]) -> tuple[int, int, list[str]]:
    start, first = _first_line(old), _first_line(new)
    lines = textwrap.dedent("".join(new_lines[first : new.end_lineno])).splitlines(keepends=True)
    indent = " " * old.col_offset
    return start, old.end_lineno, [indent + line if line.strip() else line for line in lines]


def _first_line(node: ast.AST) -> int:
    """The 0-based line a definition starts on, its decorators included."""
    return min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1


def _named_file(answer: str, body: str, files: dict[str, str]) -> str | None:
    """The file a fenced block is for: the last known path named before it."""
    before = answer[: answer.find(body)]
    best, where = None, -1
    for path in files:
        at = before.rfind(path)
        if at > where:
            best, where = path, at
    return best


def _clean_diff(text: str) -> str:
    """A diff's own lines: from its first header, with prose and fences dropped
    and a final newline."""
    start = DIFF_START.search(text)
    if start is None:
        return ""
    keep = []
    for line in text[start.start() :].splitlines():
        if line.startswith("```"):
            break
        if line.startswith(("diff --git", "index ", "--- ", "+++ ", "@@", "+", "-", " ", "\\")) or line == "":
            keep.append(line if line else " ")  # a blank context line, its space lost in the answer
        else:
            break
    while keep and keep[-1] == " ":
        keep.pop()
    return "\n".join(keep) + "\n" if any(line.startswith("@@") for line in keep) else ""


def _ensure_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


@dataclass
class Applied:
    ok: bool
    error: str = ""
    flags: tuple[str, ...] = ()
    diff: str = ""  # what was applied: the diff as given, or re-anchored


def check_patch(tree: Path, diff: str) -> Applied:
    """`git apply --check` in `tree`. A diff git will not take as written (small
    models miscount hunk lines, or give a hunk no trailing context, which git
    then anchors at the end of the file) is re-anchored: each hunk's old lines
    found in the file by content, and the diff made again."""
    first = git(["apply", "--check", "--whitespace=nowarn"], tree, input=diff, check=False, ceiling=tree.parent)
    if first.returncode == 0:
        return Applied(True, diff=diff)
    error = first.stderr.strip() or "git apply --check failed"
    fixed = reanchor(tree, diff)
    if fixed is not None:
        again = git(["apply", "--check", "--whitespace=nowarn"], tree, input=fixed, check=False, ceiling=tree.parent)
        if again.returncode == 0:
            return Applied(True, diff=fixed)
    return Applied(False, error)


HUNK = re.compile(r"^@@[^@]*@@.*$", re.M)


def reanchor(tree: Path, diff: str) -> str | None:
    """The diff made again from its hunks' content, each found in its file
    (exactly, else ignoring trailing whitespace); None if any hunk is not found."""
    out = []
    for path, hunks in _split_files(diff):
        target = (tree / path).resolve()
        if not target.is_relative_to(tree.resolve()) or not target.is_file():
            return None
        old = target.read_text(errors="replace")
        lines = old.splitlines(keepends=True)
        for before, after in hunks:
            at = _find(lines, before)
            if at is None:
                return None
            lines[at : at + len(before)] = [line + "\n" for line in after]
        new = "".join(lines)
        if new != old:
            out.append(make_diff(path, old, new))
    return "".join(out) or None


def _split_files(diff: str) -> list[tuple[str, list[tuple[list[str], list[str]]]]]:
    files: list[tuple[str, list[tuple[list[str], list[str]]]]] = []
    before: list[str] | None = None
    after: list[str] = []
    lines = diff.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            before = None  # the next file's header, not a removed line
        elif line.startswith("+++ "):
            files.append((patch_files("--- x\n" + line)[0], []))
            before = None
        elif line.startswith("@@") and files:
            before, after = [], []
            files[-1][1].append((before, after))
        elif before is not None and line[:1] in (" ", "-", "+"):
            if line[0] != "+":
                before.append(line[1:])
            if line[0] != "-":
                after.append(line[1:])
        elif before is not None and line == "":
            before.append("")
            after.append("")
    return files


def _find(lines: list[str], block: list[str]) -> int | None:
    if not block:
        return None
    for strip in (lambda s: s.rstrip("\n"), lambda s: s.rstrip()):
        want = [strip(b) for b in block]
        have = [strip(line) for line in lines]
        for i in range(len(have) - len(want) + 1):
            if have[i : i + len(want)] == want:
                return i
    return None


def apply_in(tree: Path, diff: str) -> Applied:
    checked = check_patch(tree, diff)
    if checked.ok:
        git(["apply", "--whitespace=nowarn"], tree, input=checked.diff, ceiling=tree.parent)
    return checked


class Judgement(msgspec.Struct, kw_only=True):
    """A candidate's test results against the run before it."""

    applies: bool
    diff: str = ""  # the patch as applied
    error: str = ""
    fixed: list[str] = []  # target tests that fail before and pass now
    still_failing: list[str] = []  # target tests that still fail
    broken: list[str] = []  # tests that passed before and do not now
    diff_lines: int = 0
    report: TestReport | None = None

    @property
    def verified(self) -> bool:
        return self.applies and not self.still_failing and not self.broken and bool(self.fixed)

    def rank(self) -> tuple:
        """Smaller is better: everything fixed, nothing broken, then the smallest diff."""
        return (not self.applies, len(self.still_failing), len(self.broken), self.diff_lines)

    def feedback(self) -> str:
        """What the next round is told about this candidate."""
        if not self.applies:
            return f"The patch did not apply: {self.error[:400]}"
        if self.report is not None and self.report.cut_off:
            return f"The tests were cut off: {self.report.cut_off}"
        parts = []
        for test in self.still_failing[:3]:
            parts.append(f"{test} still fails:\n{(self.report.messages.get(test, '') if self.report else '')[-700:]}")
        for test in self.broken[:3]:
            parts.append(f"{test} passed before and fails now:\n{(self.report.messages.get(test, '') if self.report else '')[-700:]}")
        return "\n".join(parts) or "All tests pass."


def judge(
    before: TestReport, after: TestReport | None, targets: list[str], diff: str, *, applies: bool = True, error: str = ""
) -> Judgement:
    changed = sum(1 for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---")))
    if not applies or after is None:
        return Judgement(applies=False, error=error, diff_lines=changed, diff=diff)
    if after.cut_off:
        return Judgement(applies=True, diff=diff, error=after.cut_off, still_failing=list(targets), diff_lines=changed, report=after)
    now = after.outcomes
    fixed = [t for t in targets if now.get(t) == "passed"]
    still = [t for t in targets if now.get(t) != "passed"]
    broken = [t for t, o in before.outcomes.items() if o == "passed" and now.get(t) in (*FAILED, None)]
    return Judgement(applies=True, diff=diff, fixed=fixed, still_failing=still, broken=broken, diff_lines=changed, report=after)
