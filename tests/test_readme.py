"""Every python snippet in README.md runs as written, on the tiny model.

Each fenced python block is taken from the README itself, so a change there is
tested as it reads. Only what must differ on a test machine is substituted, and
each test says what: the model (the tiny one, not a download) and, for the
clients of `swarm serve`, the URL of a server started on a free port. Every
snippet's max_tokens is already bounded. Each runs as its own program, in a
fresh folder, as a user would run it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import ServerProcess

from runtime.events.kinds import Finished, read_events

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
TIMEOUT_S = 600  # a cold PoCL cache compiles the kernels first


def block(marker: str) -> str:
    """The one README block that contains `marker`."""
    found = [b for b in BLOCKS if marker in b]
    assert len(found) == 1, f"{len(found)} README python blocks contain {marker!r}"
    return found[0]


MARKERS = {
    "agents": "class Reviewer(Agent):",
    "tools": "class Coder(Agent):",
    "openai": "from openai import OpenAI",
    "langchain": "from langchain_openai import ChatOpenAI",
    "cluster": "ClusterSwarm(owners=2",
}


def run_snippet(code: str, tmp_path: Path, substitutions: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for old, new in substitutions.items():
        assert code.count(old) == 1, f"{old!r} is not in the snippet exactly once"
        code = code.replace(old, new)
    path = tmp_path / "snippet.py"
    path.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_every_python_block_of_the_readme_has_its_test() -> None:
    assert len(BLOCKS) == len(MARKERS), "a README python block without a test here (add it to MARKERS and test it)"
    for marker in MARKERS.values():
        block(marker)


def test_writing_agents_runs_and_waits_for_the_pair(tiny_gguf: Path, tmp_path: Path) -> None:
    """Substituted: open_engine()'s default model, by the tiny one."""
    done = run_snippet(block(MARKERS["agents"]), tmp_path, {"open_engine()": f"open_engine({str(tiny_gguf)!r})"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n") and "ActorCrashed" not in done.stderr, (done.stdout, done.stderr)
    events = list(read_events(tmp_path / "events.jsonl"))
    ended = [e for e in events if isinstance(e, Finished) and e.agent == "reviewer"]
    assert len(ended) == 1  # the review was answered before the swarm stopped


def test_typed_answers_and_tools_run_as_written(serve_gguf: Path, tmp_path: Path) -> None:
    """Substituted: open_engine()'s default model, by the tiny one with a context
    that holds the tool list (noise weights: whatever it says, the schema, the
    choices and the tool calls hold)."""
    done = run_snippet(block(MARKERS["tools"]), tmp_path, {"open_engine()": f"open_engine({str(serve_gguf)!r})"})
    assert done.returncode == 0, done.stderr
    finding, word = done.stdout.splitlines()[:2]
    assert finding.startswith("Finding(file=") and word in ("yes", "no"), done.stdout
    assert "crashed" not in done.stderr, done.stderr


def test_the_openai_client_streams_from_swarm_serve(tiny_gguf: Path, tmp_path: Path) -> None:
    """Substituted: the server's URL (a free port, not 8000) and the model's id."""
    with ServerProcess(tiny_gguf, tmp=tmp_path) as server:
        done = run_snippet(
            block(MARKERS["openai"]),
            tmp_path,
            {
                "http://127.0.0.1:8000/v1": f"{server.url}/v1",
                "SmolLM2-135M-Instruct.Q4_1": tiny_gguf.name.removesuffix(".gguf"),
            },
        )
    assert done.returncode == 0, done.stderr
    assert "prompt_tokens" in done.stdout and "ttft_s" in done.stdout


def test_the_langchain_clients_are_built_as_written(tmp_path: Path) -> None:
    """Nothing substituted: building the clients reaches no server."""
    pytest.importorskip("langchain_openai")
    done = run_snippet(block(MARKERS["langchain"]), tmp_path, {})
    assert done.returncode == 0, done.stderr


@pytest.mark.cluster
def test_the_cluster_example_runs_on_a_local_ray(tiny_gguf: Path, tmp_path: Path) -> None:
    """Substituted: the model, by the tiny one."""
    pytest.importorskip("ray")
    done = run_snippet(block(MARKERS["cluster"]), tmp_path, {'model="qwen2.5-coder-0.5b"': f"model={str(tiny_gguf)!r}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("\n")
