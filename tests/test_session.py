"""Session files and `swarm run`: errors that name the field and line, agents
left out or crashing while the session goes on, and one run end to end on the
tiny model."""

from __future__ import annotations

import hashlib
import shutil
import textwrap
import threading
from collections import Counter
from pathlib import Path

import anyio
import pytest

from runtime.errors import ConfigError
from runtime.events.kinds import (
    Admitted,
    AgentCrashed,
    Cancelled,
    Ended,
    Finished,
    Inherited,
    Queued,
    SwarmStarted,
    SwarmStopped,
    read_events,
)
from swarm.cli import main
from swarm.runner import SessionRunner
from swarm.session import load_session, parse_session
from swarm.summary import summarize
from swarm.toml_lines import find_line

SAMPLE = Path(__file__).parent.parent / "agents" / "sample_project"


@pytest.fixture(scope="module")
def tiny_engine(tiny_gguf: Path):
    from gpu.engine import OpenCLEngine

    return OpenCLEngine(tiny_gguf)


def tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE, ws)
    return ws


def session_text(body: str) -> str:
    return textwrap.dedent(body).lstrip()


# ------------------------------------------------------------ validation


def test_an_unknown_field_is_named_with_its_line():
    text = session_text("""
        slots = 4
        policy = "resident"
        colour = "blue"
    """)
    with pytest.raises(ConfigError, match=r"line 3: .*unknown field `colour`"):
        parse_session(text, where="s.toml")


def test_a_wrong_type_inside_an_agent_table_is_named_with_its_line():
    text = session_text("""
        slots = 4

        [[agents]]
        class = "pair"
        priority = "foreground"

        [[agents]]
        class = "reviewer"
        name = "reviewer"
        priority = 2.5
    """)
    with pytest.raises(ConfigError, match=r"s.toml, line 10: .*\$\.agents\[1\]\.priority"):
        parse_session(text, where="s.toml")


def test_an_unknown_field_in_an_agent_and_a_wrong_top_level_type_are_located():
    text = session_text("""
        [[agents]]
        class = "pair"
        [[agents]]
        class = "docs"
        speed = 3
    """)
    with pytest.raises(ConfigError, match=r"line 5: .*unknown field `speed`"):
        parse_session(text)
    with pytest.raises(ConfigError, match=r"line 2: Expected `int`.*\$\.slots"):
        parse_session('model = "m.gguf"\nslots = "eight"\n')


def test_a_bad_priority_name_and_policy_are_errors_with_lines():
    with pytest.raises(ConfigError, match=r"line 3: agents\[0\]\.priority"):
        parse_session('[[agents]]\nclass = "pair"\npriority = "urgent"\n')
    with pytest.raises(ConfigError, match=r"line 1: unknown policy 'fastest'"):
        parse_session('policy = "fastest"\n')


def test_find_line_walks_arrays_of_tables():
    text = 'a = 1\n[[agents]]\nname = "x"\n[[agents]]\nclass = "y"\nname = "z"\n'
    assert find_line(text, ["a"]) == 1
    assert find_line(text, ["agents", 1, "name"]) == 6
    assert find_line(text, ["agents", 0, "name"]) == 3
    assert find_line(text, ["nowhere"]) is None


def test_a_missing_workspace_is_a_clear_error(tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text('workspace = "no_such_folder"\n')
    with pytest.raises(ConfigError, match="workspace .*no_such_folder.* does not exist"):
        SessionRunner(load_session(path), out=tmp_path / "out")


def test_relative_paths_resolve_against_the_session_file(tmp_path: Path, workspace: Path):
    path = tmp_path / "s.toml"
    path.write_text('workspace = "ws"\n')
    runner = SessionRunner(load_session(path), out=tmp_path / "out")
    assert runner.workspace == workspace.resolve()


@pytest.mark.parametrize(
    "agent, line, says",
    [
        (
            'class = "reveiwer"',
            8,
            "unknown agent class 'reveiwer' (did you mean 'reviewer'?): use a built-in name (pair, refactorer, tester, docs, reviewer)",
        ),
        ('class = "no_such_module_xyz:Agent"', 8, "cannot import no_such_module_xyz: ModuleNotFoundError"),
        ('class = "agents:Reveiwer"', 8, "module agents has no Reveiwer (did you mean 'Reviewer'?)"),
        ('class = "reviewer"\noptions = { paralel = 2 }', 9, "unknown option 'paralel' (did you mean 'parallel'?); it takes log_text, "),
        ('class = "reviewer"\noptions = { parallel = "two" }', 9, "option parallel = 'two': Expected `int`, got `str`"),
        ('class = "reviewer"\noptions = { parallel = -1 }', 9, "parallel must be an int >= 1, got -1"),
        ('class = "reviewer"\noptions = { max_tokens = 0 }', 9, "max_tokens must be an int >= 1, got 0"),
        ('class = "reviewer"\n[agents.options]\nmax_tokens = true', 10, "option max_tokens = True: Expected `int`, got `bool`"),
    ],
)
def test_an_agent_that_cannot_be_built_exits_2_naming_its_line_and_the_choices(agent, line, says, tmp_path, workspace, capsys):
    """Never a warning and a session idling without the agent, nor a crash once it runs."""
    path = tmp_path / "s.toml"
    path.write_text(f'workspace = "{workspace}"\nduration = 5\n\n[[agents]]\nclass = "docs"\n\n[[agents]]\n{agent}\n')
    assert main(["run", str(path), "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"swarm run: error: {path}, line {line}: agents[1] ") and says in err, err
    assert err.count("\n") == 1 and "warning" not in out + err


def test_an_agent_class_of_a_session_built_in_code_is_refused_at_start(tmp_path: Path, workspace: Path):
    session = parse_session(
        '[[agents]]\nclass = "docs"\n[[agents]]\nclass = "reviewer"\noptions = { not_an_option = 1 }\n', where="s.toml", base=tmp_path
    )
    session.workspace = str(workspace)
    with pytest.raises(ConfigError, match=r"s.toml, line 5: agents\[1\] \('reviewer', class 'reviewer'\): unknown option 'not_an_option'"):
        SessionRunner(session, out=tmp_path / "out")


# ------------------------------------------------------------ real sessions


class HeldSteps:
    """An engine whose steps wait until `released`: no answer can come before
    then, however fast the machine."""

    def __init__(self, engine) -> None:
        self._engine, self.released = engine, threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def step(self, batch, abandon=None):
        self.released.wait(timeout=10)  # a bound, should nothing release it
        return self._engine.step(batch, abandon)


@pytest.mark.asyncio
async def test_a_question_the_duration_cut_short_says_so_and_why(tmp_path, workspace, tiny_engine):
    text = session_text("""
        duration = 0.5
        interval = 0
        script = ["what does report.py do?"]
        [[agents]]
        class = "pair"
        priority = "foreground"
        options = { max_tokens = 64 }
    """)
    session = parse_session(text, base=tmp_path)
    session.workspace = str(workspace)
    engine = HeldSteps(tiny_engine)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if "duration" in line:
            engine.released.set()  # only now may the steps (and the answer) go on

    runner = SessionRunner(session, engine=engine, out=tmp_path / "out", say=say)
    with anyio.fail_after(120):
        await runner.run()
    assert said == [
        "you> what does report.py do?",
        "the session's duration (0.5 s) is up: stopping, and cancelling the turns still running",
        "pair> (no answer: the swarm stopped before it came)",
    ]


CRASHY = """
from swarm import Agent

class Crashy(Agent):
    async def run(self):
        async with self.generate([5, 6, 7], max_tokens=10_000, ignore_eos=True) as turn:
            async for _ in turn:
                if len(turn.tokens) == 5:
                    raise RuntimeError("crashy gives up")
"""


@pytest.mark.asyncio
async def test_a_crashing_agent_is_reported_its_turn_ended_and_the_session_goes_on(tmp_path, workspace, tiny_engine, monkeypatch):
    (tmp_path / "crashy_agents.py").write_text(CRASHY)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = session_text("""
        slots = 2
        step_tokens = 32
        interval = 0.5
        script = ["hello", "review pricing.py"]
        [[agents]]
        class = "crashy_agents:Crashy"
        name = "crashy"
        [[agents]]
        class = "reviewer"
        options = { max_tokens = 8, max_file_chars = 200 }
        [[agents]]
        class = "pair"
        priority = "foreground"
        options = { max_tokens = 8 }
    """)
    session = parse_session(text, base=tmp_path)
    session.workspace = str(workspace)
    said: list[str] = []
    runner = SessionRunner(session, engine=tiny_engine, out=tmp_path / "out", say=said.append)
    with anyio.fail_after(120):
        await runner.run()
    events = list(read_events(runner.events_path))
    (crash,) = [e for e in events if isinstance(e, AgentCrashed)]
    assert crash.agent == "crashy" and "crashy gives up" in crash.reason
    ends = [e for e in events if isinstance(e, Ended) and e.agent == "crashy"]
    assert [type(e) for e in ends] == [Cancelled]
    after = [e for e in events if isinstance(e, Finished) and e.agent == "pair" and e.t > crash.t]
    assert after, "the session went on after the crash"
    assert sum(1 for line in said if line.startswith("pair>")) == 2  # stopped when the script was done
    summary = summarize(events, runner.agents, tiny_engine.cost)
    assert summary.agents["crashy"].crashed and summary.agents["pair"].turns == 1
    assert len(summary.fg_ttft_s) >= 2  # the pair's turn and the reviewer's while it inherited
    # Every foreground turn's feel, and its idle estimate from the engine's law.
    n = len(summary.fg_ttft_s)
    assert len(summary.fg_turn_s) == len(summary.idle_turn_s) == len(summary.idle_ttft_s) == n
    assert all(t >= f for t, f in zip(summary.fg_turn_s, summary.fg_ttft_s, strict=False))
    assert all(0 < i <= t for i, t in zip(summary.idle_ttft_s, summary.idle_turn_s, strict=False))
    assert len(summary.fg_itl_s) == sum(r.tokens - 1 for a in runner.agents for r in getattr(a, "records", []) if r.priority >= 10)


def test_swarm_run_end_to_end_on_the_tiny_model(tmp_path, workspace, tiny_gguf, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # else rich may wrap a row label across lines
    before = tree_hash(workspace)
    path = tmp_path / "session.toml"
    path.write_text(
        session_text(f"""
        model = "{tiny_gguf}"
        slots = 4
        step_tokens = 32
        workspace = "ws"
        out = "{tmp_path / "swarm-out"}"
        duration = 60
        turns = 2
        interval = 0.2
        script = ["what does report.py do?", "review inventory.py", "never sent"]

        [[agents]]
        class = "pair"
        priority = "foreground"
        options = {{ max_tokens = 8 }}
        [[agents]]
        class = "reviewer"
        options = {{ max_tokens = 8, parallel = 2 }}
        [[agents]]
        class = "refactorer"
        options = {{ max_tokens = 8 }}
    """)
    )
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "events:" in out and "swarm tail" in out and "time to first token" in out
    assert "inter-token latency" in out and "turn time" in out and "idle p50" in out
    (run_dir,) = (tmp_path / "swarm-out").iterdir()
    events = list(read_events(run_dir / "events.jsonl"))
    assert isinstance(events[0], SwarmStarted) and isinstance(events[-1], SwarmStopped)
    queued = {e.turn for e in events if isinstance(e, Queued)}
    assert Counter(e.turn for e in events if isinstance(e, Ended)) == Counter(queued)
    assert [e.agent for e in events if isinstance(e, Inherited)] == ["reviewer"]
    assert "never sent" not in out  # turns = 2 stopped the script
    admitted = [e for e in events if isinstance(e, Admitted)]
    assert admitted and all(e.cached_tokens is not None for e in admitted)
    assert "prompt tokens:" in out and "reused from the prefix cache" in out
    assert tree_hash(workspace) == before
    assert any((run_dir / "reviewer").rglob("*.md"))
