"""The project's private copy, patches read from answers, and their verification
end to end on a tiny repository."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import anyio
import pytest

from runtime.errors import ConfigError
from swarm.coding.patches import PYTHON_BLOCK, code_block, code_proposal, read_proposal, splice
from swarm.coding.project import ProjectCopy, apply_patch
from swarm.coding.sandbox import Limits, Sandbox
from swarm.coding.testing import CommandRunner, detect_runner
from swarm.coding.tools import Toolbox

pytestmark = pytest.mark.usefixtures("plain_pytest")

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
KNOWN_DIFF = """--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


def make_project(root: Path, *, git: bool) -> Path:
    root.mkdir()
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TESTS)
    if git:
        for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"]):
            subprocess.run(["git", *args], cwd=root, check=True)
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root (the .git folder too) by content hash."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def toolbox(project: Path, out: Path) -> Toolbox:
    copy = ProjectCopy.create(project, out)
    return Toolbox(copy, detect_runner(copy.copy), Sandbox(), out / "scratch")


class StandIn:
    """In place of the model: an answer fixed in advance (the parsing, checking
    and testing after it are the real ones)."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    async def propose(self, box: Toolbox) -> object:
        files = {"calc.py": await box.read_file("calc.py")}
        proposal = read_proposal(self.answer, files, default="calc.py")
        return None if proposal is None else await box.propose_patch(proposal.diff)


@pytest.mark.parametrize("git", [True, False])
def test_a_known_diff_is_verified_and_garbage_is_not(tmp_path: Path, git: bool) -> None:
    project = make_project(tmp_path / "proj", git=git)
    before = snapshot(project)
    out = tmp_path / "out"
    box = toolbox(project, out)

    async def main():
        baseline = await box.run_tests()
        good = await StandIn(f"The fix:\n```diff\n{KNOWN_DIFF}```\n").propose(box)
        garbage = await StandIn("```diff\n--- a/calc.py\n+++ b/calc.py\n@@ -7,2 +7,2 @@\n-nothing here\n+at all\n```").propose(box)
        nonsense = await StandIn("I think the code is fine!").propose(box)
        wrong = await box.propose_patch(KNOWN_DIFF.replace("a + b", "a * b"))
        return baseline, good, garbage, nonsense, wrong

    baseline, good, garbage, nonsense, wrong = anyio.run(main)
    assert baseline.failing == ["test_calc.py::test_add"] and baseline.passing == ["test_calc.py::test_mul"]
    assert good.verified and good.fixed == ["test_calc.py::test_add"] and good.broken == [] and good.diff_lines == 2
    assert not garbage.applies and not garbage.verified and "patch" in garbage.error
    assert nonsense is None
    assert wrong.applies and not wrong.verified and wrong.still_failing == ["test_calc.py::test_add"]
    assert "still fails" in wrong.feedback()
    box.project.close()
    assert snapshot(project) == before  # nothing of the run is left in the user's tree (nor its .git)


def test_a_fenced_function_replaces_only_itself() -> None:
    answer = "Fixed:\n```python\ndef add(a, b):\n    return a + b\n```"
    proposal = read_proposal(answer, {"calc.py": CALC}, default="calc.py")
    assert proposal is not None and proposal.source == "fragment"
    assert "+    return a + b" in proposal.diff and "mul" not in "".join(line for line in proposal.diff.splitlines() if line[:1] in "+-")
    assert splice(CALC, "not python (") is None


def test_a_whole_fenced_file_replaces_the_file() -> None:
    whole = CALC.replace("a - b", "a + b")
    proposal = read_proposal(f"calc.py:\n```python\n{whole}```", {"calc.py": CALC, "test_calc.py": TESTS})
    assert proposal is not None and proposal.source == "file"


def test_the_worktree_holds_the_users_uncommitted_changes(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj", git=True)
    (project / "calc.py").write_text(CALC + "\n# edited\n")
    (project / "notes.py").write_text("x = 1\n")
    copy = ProjectCopy.create(project, tmp_path / "out")
    try:
        assert (copy.copy / "calc.py").read_text().endswith("# edited\n")
        assert (copy.copy / "notes.py").read_text() == "x = 1\n"
    finally:
        copy.close()


def test_apply_refuses_a_dirty_git_tree_saying_what_it_would_do(tmp_path: Path) -> None:
    project = make_project(tmp_path / "proj", git=True)
    (project / "test_calc.py").write_text(TESTS + "\n# mine\n")
    before = snapshot(project)
    with pytest.raises(ConfigError) as caught:
        apply_patch(project, KNOWN_DIFF)
    message = str(caught.value)
    assert "test_calc.py" in message and "nothing written" in message and "calc.py" in message.split("would")[1]
    assert snapshot(project) == before


@pytest.mark.parametrize("git", [True, False])
def test_apply_writes_a_clean_tree(tmp_path: Path, git: bool) -> None:
    project = make_project(tmp_path / "proj", git=git)
    assert apply_patch(project, KNOWN_DIFF) == ["calc.py"]
    assert "a + b" in (project / "calc.py").read_text()


def test_no_tests_is_a_clear_error_and_a_test_command_is_taken(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="--test-cmd"):
        detect_runner(tmp_path)
    assert isinstance(detect_runner(tmp_path, "make check"), CommandRunner)


def test_a_test_run_that_hangs_or_floods_is_cut_off_and_reported(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "test_slow.py").write_text("import time\n\n\ndef test_sleeps():\n    time.sleep(10_000)\n")
    (project / "test_loud.py").write_text("def test_floods():\n    while True:\n        print('x' * 1000)\n")
    copy = ProjectCopy.create(project, tmp_path / "out")
    # The hang waits out its timeout; the flood's is far past when it floods.
    for selected, why, timeout in ((["test_slow.py"], "timeout", 5), (["-s", "test_loud.py"], "output flood", 60)):
        limits = Limits(timeout_s=timeout, output_bytes=100_000)
        box = Toolbox(copy, detect_runner(copy.copy), Sandbox(limits), tmp_path / "out" / "scratch")
        report = anyio.run(box.run_tests, selected)
        assert report.cut_off is not None and report.cut_off.startswith(why)
        assert not report.ran and report.summary().startswith("cut off: ")


def test_candidates_get_a_timeout_scaled_to_the_baseline(tmp_path: Path) -> None:
    box = toolbox(make_project(tmp_path / "proj", git=False), tmp_path / "out")
    assert box.sandbox.limits.timeout_s == Limits().timeout_s
    baseline = anyio.run(box.run_tests)
    assert box.sandbox.limits.timeout_s == min(Limits().timeout_s, max(30.0, 10 * baseline.seconds))


INVENTORY = """import json


class Inventory:
    def __init__(self):
        self.items = {}

    def remove(self, name, qty):
        if self.items[name] <= qty:
            raise ValueError(name)
        self.items[name] -= qty

    def total(self):
        return sum(self.items.values()) + 1


def helper():
    return 1
"""


def test_a_method_given_alone_replaces_its_namesake_indented() -> None:
    new = splice(INVENTORY, "def total(self):\n    return sum(self.items.values())\n")
    assert new is not None and "    def total(self):\n        return sum(self.items.values())\n\n\ndef helper" in new
    assert new.count("def remove") == 1 and "import json" in new


def test_a_class_holding_some_methods_replaces_just_those() -> None:
    fragment = (
        "class Inventory:\n"
        "    def remove(self, name, qty):\n"
        "        if self.items[name] < qty:\n"
        "            raise ValueError(name)\n"
        "        self.items[name] -= qty\n"
    )
    new = splice(INVENTORY, fragment)
    assert new is not None and "if self.items[name] < qty:" in new
    assert "def __init__" in new and "+ 1" in new  # the methods it did not give are kept


def test_a_fragment_that_fits_nowhere_is_no_proposal() -> None:
    assert splice(INVENTORY, "def unrelated(x):\n    return x\n") is None
    assert read_proposal("```python\ndef unrelated(x):\n    return x\n```", {"inventory.py": INVENTORY}) is None


def test_an_answer_held_to_one_python_block_is_read_whole() -> None:
    import re

    answer = "```python\ndef add(a, b):\n    return a + b  # `a` and `b`\n```"
    assert re.fullmatch(PYTHON_BLOCK, answer)
    code = code_block(answer)
    assert code == "def add(a, b):\n    return a + b  # `a` and `b`\n"
    proposal = code_proposal(code, {"calc.py": CALC})
    assert proposal is not None and "+    return a + b" in proposal.diff and proposal.source == "fragment"
    # Prose, or a block cut off before it closed, is not one: the fixer then reads it as free text.
    assert code_block("Here:\n" + answer) is None and code_block(answer[:-3]) is None
    assert not re.fullmatch(PYTHON_BLOCK, "```python\nx = 1\n```\nand more")


def test_one_block_fixing_two_files_is_one_verified_patch(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "stock.py").write_text(
        "class Stock:\n    def __init__(self):\n        self.counts = {}\n\n"
        "    def take(self, item):\n        self.counts[item] -= 1\n\n"
        "    def items(self):\n        return sorted(self.counts)\n"
    )
    (project / "report.py").write_text("def low(stock, limit):\n    return [i for i in stock.items() if stock.counts[i] < limit]\n")
    (project / "test_stock.py").write_text(
        "from report import low\nfrom stock import Stock\n\n\n"
        "def test_low():\n    s = Stock()\n    s.counts = {'a': 1, 'b': 2, 'c': 3}\n    s.take('a')\n    assert s.items() == ['b', 'c']\n"
        "    assert low(s, 2) == ['b']\n"
    )
    code = (
        "class Stock:\n    def take(self, item):\n        self.counts[item] -= 1\n        if not self.counts[item]:\n"
        "            del self.counts[item]\n\n\ndef low(stock, limit):\n    return [i for i in stock.items() if stock.counts[i] <= limit]\n"
    )
    box = toolbox(project, tmp_path / "out")

    async def main():
        files = {name: await box.read_file(name) for name in ("stock.py", "report.py")}
        proposal = code_proposal(code, files)
        assert proposal is not None and "a/stock.py" in proposal.diff and "a/report.py" in proposal.diff
        assert code_proposal(code + "\n\ndef nowhere():\n    pass\n", files) is None  # a name no file has: no guess
        return await box.propose_patch(proposal.diff)

    judged = anyio.run(main)
    assert judged.verified and judged.fixed == ["test_stock.py::test_low"]
    box.project.close()
