"""A model's hollow twin (gpu/model/hollow.py, `swarm models --hollow`): the same
metadata, tensor shapes and types, zero weights; the engine runs it (for timing
where the model itself cannot go), and every logit is zero."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu.engine import OpenCLEngine
from gpu.model.gguf_file import read_gguf
from runtime.scheduling.work import Work
from swarm.cli import main


def test_the_twin_keeps_everything_but_the_weights(tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    twin = tmp_path / "twin.gguf"
    assert main(["models", "--hollow", str(tiny_gguf), str(twin)]) == 0
    assert "hollow twin" in capsys.readouterr().out
    meta, tensors = read_gguf(tiny_gguf)
    twin_meta, twin_tensors = read_gguf(twin)
    assert twin.stat().st_size == tiny_gguf.stat().st_size and twin_meta == meta
    assert [(t.name, t.qtype, t.shape, t.offset) for t in twin_tensors] == [(t.name, t.qtype, t.shape, t.offset) for t in tensors]
    assert all(not t.data.any() for t in twin_tensors) and any(t.data.any() for t in tensors)

    engine = OpenCLEngine(twin, num_blocks=8, block_size=16)
    logits = engine.step_logits([Work(turn=0, tokens=[5, 6, 7], start=0, block_table=[0], sample=True)])
    assert np.all(logits == 0)


def test_the_twin_is_never_written_over_its_model(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = tiny_gguf.read_bytes()
    assert main(["models", "--hollow", str(tiny_gguf), str(tiny_gguf)]) == 2
    assert "the model itself" in capsys.readouterr().err
    assert tiny_gguf.read_bytes() == before
