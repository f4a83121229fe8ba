"""scripts/kernel_ab.py: the base engine is built from the other tree's kernels, the new one
from this checkout's, and the report says whether their tokens agree, on either family."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from gpu.model.load import Model

ROOT = Path(__file__).resolve().parents[1]

spec = importlib.util.spec_from_file_location("kernel_ab", ROOT / "scripts" / "kernel_ab.py")
kernel_ab = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = kernel_ab
spec.loader.exec_module(kernel_ab)

EMBED_ROW = "load_block(WTYPE, qs, dm, tokens[t], nb, b, &lo, &hi);"


def tree_with_kernels(path: Path, embed_row: str = EMBED_ROW) -> Path:
    """A tree holding this checkout's kernels/, its embedding reading `embed_row`'s row."""
    shutil.copytree(ROOT / "kernels", path / "kernels")
    common = path / "kernels" / "common.cl"
    assert EMBED_ROW in common.read_text()
    common.write_text(common.read_text().replace(EMBED_ROW, embed_row))
    return path


def test_the_base_side_runs_the_other_tree_s_kernels(tmp_path: Path, tiny_model: Model, kernels: str) -> None:
    same = kernel_ab.compare(tiny_model, tree_with_kernels(tmp_path / "same"), kernels, steps=4, chunks=1)
    assert same["decode"]["same_tokens"] and same["kernels"] == kernels
    assert same["decode"]["layer_launch"] == (kernels == "cpu")  # the steps a user's engine takes
    assert {"swiglu", "down", "attention", "head"} <= {kind.split()[0] for kind in same["prompt"]["kinds"]}
    assert all(m["base"] > 0 and m["new"] > 0 for m in (same["decode"]["ms"], same["prompt"]["ms"]))
    text = kernel_ab.table(same)
    assert "same tokens: yes" in text and f"{same['prompt']['tokens']}-token chunk" in text
    # the base embeds each token's neighbour in the vocabulary: another model's tokens
    other = tree_with_kernels(tmp_path / "other", EMBED_ROW.replace("tokens[t]", "(tokens[t] ^ 1)"))
    assert not kernel_ab.compare(tiny_model, other, kernels, steps=4, chunks=0)["decode"]["same_tokens"]


def test_a_tree_without_kernels_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    assert kernel_ab.main(["--against", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"--against: no kernels/ in {tmp_path}"


def test_nothing_to_compare_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    assert kernel_ab.main(["--against", str(tree_with_kernels(tmp_path)), "--steps", "0", "--chunks", "0"]) == 2
    assert capsys.readouterr().err.strip() == "--steps and --chunks must be at least 0, and not both 0"


def test_an_unknown_model_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    tree = tree_with_kernels(tmp_path)
    assert kernel_ab.main(["--against", str(tree), "--model", str(tmp_path / "missing.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kernel_ab: ") and "missing.gguf" in err and len(err.splitlines()) == 1
