"""The ready-made agents: they write proposals only into the out folder, and the
pair programmer's review request makes the reviewer inherit its priority."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import anyio
import pytest

from agents import DocWriter, PairProgrammer, Refactorer, Reviewer, TestWriter, WorkspaceAgent
from runtime.events.kinds import Admitted, Finished, Inherited, Preempted, Queued, Restored
from runtime.scheduling.timing import TimingEngine
from swarm import BACKGROUND, FOREGROUND, Swarm

SAMPLE = Path(__file__).parent.parent / "agents" / "sample_project"


@pytest.fixture(scope="module")
def tiny_engine(tiny_gguf: Path):
    from gpu.engine import OpenCLEngine

    return OpenCLEngine(tiny_gguf)


def tree_hash(root: Path, skip: Path | None = None) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and (skip is None or not p.is_relative_to(skip))
    }


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE, ws)
    return ws


@pytest.mark.asyncio
async def test_background_agents_write_one_proposal_per_file_only_under_out(workspace: Path):
    # The out folder inside the workspace is the awkward case: the agents must
    # neither read their own proposals back nor touch the user's files.
    out = workspace / "swarm-out"
    before = tree_hash(workspace)
    classes = [Refactorer, TestWriter, DocWriter, Reviewer]
    with anyio.fail_after(60):
        async with Swarm(TimingEngine(), slots=4) as swarm:  # no tokenizer: the agents pass token ids
            agents = [
                await swarm.spawn(cls(cls.__name__.lower(), workspace=workspace, out=out, max_tokens=5, rounds=1, parallel=2))
                for cls in classes
            ]
            for agent in agents:
                while agent.system.is_alive(agent.name) and len(agent.records) < len(agent.files()):
                    await anyio.sleep(0.01)
    assert tree_hash(workspace, skip=out) == before
    for agent in agents:
        sources = agent.files()
        assert sources and not any(p.is_relative_to(out) for p in sources)
        expected = {out / agent.name / (p.name + ".md") for p in sources}
        assert set(agent.written) == expected and all(p.is_file() for p in expected)
    assert all(p.suffix == ".py" for p in agents[1].files())  # the test writer only takes code
    written = {p for p in out.rglob("*") if p.is_file()}
    assert written == {p for a in agents for p in a.written}


def test_an_agent_refuses_to_write_outside_its_out_folder(tmp_path: Path, workspace: Path):
    agent = DocWriter("docs", workspace=workspace, out=tmp_path / "out")
    with pytest.raises(PermissionError, match="may only write under"):
        agent._write(workspace / "pricing.py", "oops")
    with pytest.raises(PermissionError):
        agent._write(tmp_path / "out" / "docs" / ".." / ".." / "ws" / "report.py", "oops")
    assert "oops" not in (workspace / "pricing.py").read_text()


class Hog(WorkspaceAgent):
    """Keeps a slot busy, turn after turn (token ids: no text needed). Each turn
    stays inside the tiny model's 512-token context."""

    async def run(self) -> None:
        while True:
            async with self.generate([9] * 8, max_tokens=400, ignore_eos=True) as turn:
                async for _ in turn:
                    pass


@pytest.mark.asyncio
async def test_the_pairs_review_request_lends_the_reviewer_foreground_priority(tmp_path: Path, workspace: Path, tiny_engine):
    out = tmp_path / "out"
    said: list[str] = []
    events = []
    with anyio.fail_after(120):
        async with Swarm(tiny_engine, slots=2, step_tokens=32) as swarm:
            sub = swarm.bus.subscribe(max_buffer=10**9)
            for i in range(2):
                await swarm.spawn(Hog(f"hog{i}", workspace=workspace, out=out))
            # rounds=0 passes: the reviewer only answers asks.
            reviewer = await swarm.spawn(Reviewer("reviewer", workspace=workspace, out=out, rounds=0, max_tokens=6, max_file_chars=300))
            # Explicitly synchronised, not timed: the pair asks only once both hogs
            # hold a slot, however long this machine took to get there.
            async for event in sub:
                events.append(event)
                if sum(isinstance(e, Admitted) and e.agent.startswith("hog") for e in events) == 2:
                    break
            pair = PairProgrammer(
                "pair", workspace=workspace, out=out, script=["review pricing.py"], interval_s=0, say=said.append, log_text=True
            )
            await swarm.spawn(pair)
            async for event in sub:
                events.append(event)
                if isinstance(event, Restored):
                    break
            while pair.answered < 1:
                await anyio.sleep(0.01)
    inherited = [e for e in events if isinstance(e, Inherited)]
    assert [(e.agent, e.priority, e.base_priority, e.by_agent) for e in inherited] == [("reviewer", FOREGROUND, BACKGROUND, "pair")]
    review_turn = next(e for e in events if isinstance(e, Queued) and e.agent == "reviewer")
    assert review_turn.priority == FOREGROUND
    # The review takes a hog's slot at the next boundary, unless a hog turn
    # happened to end right then and left one free (rare, but timing is real here).
    admitted = next(e for e in events if isinstance(e, Admitted) and e.agent == "reviewer")
    preempted = [e for e in events if isinstance(e, Preempted) and e.by_agent == "reviewer"]
    freed = [e for e in events if isinstance(e, Finished) and e.agent.startswith("hog") and e.step == admitted.step]
    assert preempted or freed
    assert all(e.agent.startswith("hog") and e.by_priority == FOREGROUND for e in preempted)
    assert events[-1].agent == "reviewer" and events[-1].priority == BACKGROUND
    assert pair.review_asks == 1 and said[0] == "you> review pricing.py" and said[1].startswith("pair> ")
    assert reviewer.records[0].priority == FOREGROUND and reviewer.records[0].tokens >= 1
    assert (out / "pair" / "transcript.md").is_file()  # log_text: the pair keeps its conversation


@pytest.mark.asyncio
async def test_a_review_of_a_missing_file_is_answered_without_asking(tmp_path: Path, workspace: Path):
    said: list[str] = []
    with anyio.fail_after(30):
        async with Swarm(TimingEngine(), slots=1) as swarm:
            pair = await swarm.spawn(PairProgrammer("pair", workspace=workspace, script=["review nope.py"], interval_s=0, say=said.append))
            while pair.answered < 1:
                await anyio.sleep(0.01)
    assert pair.review_asks == 0 and "no file 'nope.py'" in said[1]


@pytest.mark.asyncio
async def test_agents_reading_one_file_compute_it_once(workspace: Path, tmp_path: Path):
    """The team prompt and the file come before each agent's role and task, so the
    prefix cache shares a file's K/V among every agent that reads it, even those
    that read it at the same time."""
    classes = [Refactorer, TestWriter, DocWriter, Reviewer]
    computed = {}
    for cache in (True, False):
        with anyio.fail_after(60):
            async with Swarm(TimingEngine(), slots=4, prefix_cache=cache) as swarm:  # token ids: one a byte
                log = swarm.bus.subscribe()
                agents = [
                    await swarm.spawn(
                        cls(
                            cls.__name__.lower(),
                            workspace=workspace,
                            out=tmp_path / str(cache),
                            max_tokens=4,
                            max_file_chars=250,
                            rounds=1,
                            parallel=2,
                        )
                    )
                    for cls in classes
                ]
                for agent in agents:
                    await swarm.join(agent)
        events = [e async for e in log]
        prompts = sum(e.tokens for e in events if isinstance(e, Queued))
        computed[cache] = prompts - sum(e.cached_tokens for e in events if isinstance(e, Finished))
        assert sum(len(a.records) for a in agents) == sum(len(a.files()) for a in agents)  # a turn a file each
    # Each file's team prompt and text (about 3/4 of a prompt) is computed once, not by
    # every agent: each file's whole prompt once, then only role-and-task tails.
    assert computed[True] < 0.5 * computed[False]


@pytest.mark.asyncio
async def test_a_recording_agent_keeps_every_finished_turn_however_it_was_run(tmp_path: Path):
    # The planner answers through use_tools, which runs its turns with
    # `generate`, not `answer`: the session summary's foreground figures must
    # count them all the same, and a turn left early is no finished turn.
    from agents import RecordingAgent
    from runtime.events.kinds import read_events
    from swarm.summary import summarize

    class Asker(RecordingAgent):
        async def run(self) -> None:
            await self.answer("system", "a question", max_tokens=4)
            async with self.generate(list(range(1, 20)), max_tokens=3) as turn:
                async for _ in turn:
                    pass
            async with self.generate(list(range(1, 9)), max_tokens=50) as turn:
                async for _ in turn:
                    break  # cancelled: no record

    with anyio.fail_after(60):
        async with Swarm(TimingEngine(), slots=2, events=tmp_path / "events.jsonl") as swarm:
            asker = await swarm.spawn(Asker("asker", FOREGROUND))
            await swarm.join(asker)
    assert [(r.tokens, r.prompt_tokens, r.priority) for r in asker.records] == [
        (4, len(asker.chat("system", "a question")), FOREGROUND),
        (3, 19, FOREGROUND),
    ]
    assert all(r.ttft_s is not None and r.turn_s is not None for r in asker.records)
    summary = summarize(list(read_events(tmp_path / "events.jsonl")), [asker])
    assert summary.fg_ttft_s == [r.ttft_s for r in asker.records]
    assert len(summary.fg_itl_s) == 3 + 2
