"""Two GPU owners as Ray actors on a real local Ray cluster (PoCL, the tiny model).

Marked `cluster`: the README's test command runs them; `-m "not cluster"` skips
them for a quick local loop. Everything is synchronised on events and tokens,
never on how long a step takes."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import anyio
import msgspec
import pytest
from pausing import Pausable

from runtime.errors import ConfigError, TurnError, TurnFailed
from runtime.events.kinds import Admitted, Ended, Inherited, Preempted, Queued, read_events
from runtime.scheduling.constraints import Constraint, JsonSchema
from swarm import BACKGROUND, FOREGROUND, Agent, handler
from swarm.bench import swarm as bench_swarm
from swarm.cluster import ClusterSwarm, Pinned
from swarm.cluster.host import OwnerSpec

ray = pytest.importorskip("ray", reason="the cluster tests need Ray: pip install -e '.[cluster]'")

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.asyncio,
    # Ray's own modules warn on import and at shutdown; they are not ours to fix.
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"),
]
LIMIT_S = 300  # a fresh machine compiles every kernel in every owner first


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def cluster(tiny_gguf: Path, tmp_path: Path, **kw) -> ClusterSwarm:
    return ClusterSwarm(2, model=str(tiny_gguf), slots=1, events=tmp_path / "events.jsonl", **kw)


def ends_once(path: Path) -> Counter:
    """Every turn in the merged stream ends in exactly one terminal event."""
    events = list(read_events(path))
    queued = {e.turn for e in events if isinstance(e, Queued)}
    ended = Counter(e.turn for e in events if isinstance(e, Ended))
    assert set(ended) == queued and set(ended.values()) == {1}, (queued, ended)
    return ended


class Looper(Pausable):
    """Background load: one turn that runs until the swarm stops, noting its
    pauses (a turn that could end would, on a loaded machine, sometimes end before
    the next agent is placed or the foreground arrives to preempt it)."""

    def __init__(self, name: str, tokens: int = 10**6) -> None:
        super().__init__(name)
        self.tokens = tokens
        self.started = anyio.Event()

    async def run(self) -> None:
        async with self.generate([5, 6, 7], max_tokens=self.tokens, ignore_eos=True) as turn:
            async for _ in turn:
                self.started.set()


class Review(msgspec.Struct):
    prompt: list[int]


class Go(msgspec.Struct):
    pause_after: int  # hold the turn after this many tokens (0: never)


class Reviewer(Agent):
    @handler
    async def review(self, msg: Review) -> str:
        return await self.complete(msg.prompt, max_tokens=8, ignore_eos=True)


async def test_routing_affinity_inheritance_across_owners_and_preemption_on_each(local_ray, tiny_gguf: Path, tmp_path: Path) -> None:
    with anyio.fail_after(LIMIT_S):
        # The lead and its reviewer are pinned apart; the background goes by load.
        pins = Pinned(owners={"pair": "gpu0", "reviewer": "gpu1"})
        async with cluster(tiny_gguf, tmp_path, placement=pins) as swarm:
            loads = [await swarm.spawn(Looper(f"bg{i}")) for i in range(2)]
            for agent in loads:
                await agent.started.wait()
            homes = dict(swarm.client.router.home)
            assert {homes["bg0"], homes["bg1"]} == {"gpu0", "gpu1"}  # least loaded: one each

            pair = await swarm.spawn(Agent("pair", FOREGROUND))
            await swarm.spawn(Reviewer("reviewer", BACKGROUND))
            # The foreground's own turn preempts the background on its owner ...
            await pair.complete([1, 2, 3], max_tokens=4, ignore_eos=True)
            # ... and its ask lends foreground to the reviewer's turn on the other.
            await pair.ask("reviewer", Review([9, 8, 7]), timeout=LIMIT_S)
            assert (swarm.client.router.home["pair"], swarm.client.router.home["reviewer"]) == ("gpu0", "gpu1")
            assert swarm.client.router.home["bg0"] == homes["bg0"]  # affinity: agents stay put
        events = list(read_events(tmp_path / "events.jsonl"))
        preempted = [e for e in events if isinstance(e, Preempted)]
        assert {e.owner for e in preempted} == {"gpu0", "gpu1"}
        assert {e.by_agent for e in preempted} == {"pair", "reviewer"}
        assert all(e.by_priority == FOREGROUND for e in preempted)
        lifted = [e for e in events if isinstance(e, Inherited)]
        assert [(e.agent, e.by_agent, e.priority) for e in lifted] == [("reviewer", "pair", FOREGROUND)]
        queued = next(e for e in events if isinstance(e, Queued) and e.agent == "reviewer")
        admitted = next(e for e in events if isinstance(e, Admitted) and e.agent == "reviewer")
        assert queued.priority == FOREGROUND and admitted.owner == queued.owner
        assert admitted.step - queued.step <= 1  # the lift took effect within a step of the ask
        ends_once(tmp_path / "events.jsonl")


class Mover(Pausable):
    def __init__(self, name: str, constraint: Constraint | None = None) -> None:
        super().__init__(name)
        self.halfway = anyio.Event()
        self.go_on = anyio.Event()
        self.constraint = constraint

    @handler
    async def go(self, msg: Go) -> list[int]:
        """The first TOKENS tokens of a turn too long to end on its own, so its
        owner is surely mid-turn when the test kills it, however fast it runs."""
        async with self.generate(PROMPT, max_tokens=10**6, ignore_eos=True, constraint=self.constraint) as turn:
            async for _ in turn:
                if len(turn.tokens) >= msg.pause_after and not self.halfway.is_set():
                    self.halfway.set()
                    await self.go_on.wait()
                if len(turn.tokens) >= TOKENS:
                    break
        return turn.tokens[:TOKENS]


PROMPT, TOKENS = [3, 1, 4, 1, 5], 24
# An answer longer than TOKENS: a turn held to it is mid-array when its owner dies.
NUMBERS = JsonSchema(json.dumps({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 64}))


@pytest.mark.parametrize("constraint", [None, NUMBERS], ids=["free", "constrained"])
async def test_killing_an_owner_mid_turn_loses_nothing_and_changes_no_token(local_ray, tiny_gguf: Path, tmp_path: Path, constraint) -> None:
    with anyio.fail_after(LIMIT_S):
        # (speculating: a lone turn verifies lookup's drafts, on either owner)
        async with cluster(tiny_gguf, tmp_path, speculate="lookup") as swarm, anyio.create_task_group() as tg:
            expected = await swarm.spawn(Agent("ref"))
            asked = swarm.bus.now()
            async with expected.generate(PROMPT, max_tokens=TOKENS, ignore_eos=True, constraint=constraint) as turn:
                entered = swarm.bus.now()  # before the request can have crossed to an owner
                async for _ in turn:
                    pass
            reference = turn.tokens
            # The wait starts when the agent asked, not when its owner heard of it.
            assert asked <= turn.queued_t <= entered
            mover = await swarm.spawn(Mover("mover", constraint))
            result: list[list[int]] = []

            async def go() -> None:
                result.append(await swarm.system.ask("mover", Go(6), timeout=LIMIT_S))

            tg.start_soon(go)
            await mover.halfway.wait()
            home = swarm.client.router.home["mover"]
            swarm.kill_owner(home)
            mover.go_on.set()
        assert len(reference) == TOKENS and result == [reference]
        assert swarm.client.moves == 1 and swarm.client.router.live == {"gpu0", "gpu1"} - {home}
        (pause,) = mover.pauses
        (resume,) = mover.resumes
        assert pause.by_turn is None and pause.at_token >= 6 and resume.at_token >= 6
        events = list(read_events(tmp_path / "events.jsonl"))
        moved = [e for e in events if isinstance(e, Preempted) and e.reason == f"owner {home} lost"]
        assert len(moved) == 1 and moved[0].owner == home
        ended = [e for e in events if isinstance(e, Ended) and e.turn == moved[0].turn]
        assert len(ended) == 1 and ended[0].owner != home  # it ended where it moved to, left by its agent
        ends_once(tmp_path / "events.jsonl")


class Runner(Agent):
    """Runs turns on request, noting each turn's id and what its agent was told."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.told: dict[int, type | None] = {}  # turn id -> the error it raised (None: finished)
        self.decoding = anyio.Event()

    async def run_turn(self, max_tokens: int) -> None:
        async with self.generate(PROMPT, max_tokens=max_tokens, ignore_eos=True) as turn:
            try:
                async for _ in turn:
                    self.decoding.set()
                self.told[turn.id] = None
            except TurnError as exc:
                self.told[turn.id] = type(exc)


async def test_when_the_last_owner_dies_every_turn_still_ends_once_in_the_log(local_ray, tiny_gguf: Path, tmp_path: Path) -> None:
    with anyio.fail_after(LIMIT_S):
        # One long turn decoding and one queued behind it on each owner (one slot each).
        pins = Pinned(owners={"run0": "gpu0", "wait0": "gpu0", "run1": "gpu1", "wait1": "gpu1"})
        async with cluster(tiny_gguf, tmp_path, placement=pins) as swarm:
            agents = {name: await swarm.spawn(Runner(name)) for name in pins.owners}
            watch = swarm.bus.subscribe()
            async with anyio.create_task_group() as tg:
                for name in ("run0", "run1"):
                    tg.start_soon(agents[name].run_turn, 10**6)
                    await agents[name].decoding.wait()
                for name in ("wait0", "wait1"):
                    tg.start_soon(agents[name].run_turn, 8)
                waiting = set()
                async for event in watch:  # each owner has queued its second turn
                    if isinstance(event, Queued) and event.agent.startswith("wait"):
                        waiting.add(event.agent)
                        if len(waiting) == 2:
                            break
                for owner in ("gpu0", "gpu1"):
                    swarm.kill_owner(owner)
            assert swarm.client.router.live == set()
            # Turns asked for once no owner is left fail at once, and are logged too.
            for agent in agents.values():
                await agent.run_turn(8)
        told = {turn: error for agent in agents.values() for turn, error in agent.told.items()}
        assert len(told) == 8 and set(told.values()) == {TurnFailed}
        events = list(read_events(tmp_path / "events.jsonl"))
        ended = Counter(e.turn for e in events if isinstance(e, Ended))
        assert ended == Counter(set(told)), (ended, told)  # each turn asked for: one terminal event
        ends_once(tmp_path / "events.jsonl")


async def _bench(args):
    # bench swarm's entry point runs its own event loop; give it a thread of its own.
    return await anyio.to_thread.run_sync(bench_swarm.run, args)


async def test_bench_swarm_over_the_cluster_reports_each_owner_and_the_totals(local_ray, tiny_gguf: Path, capsys) -> None:
    parser = argparse.ArgumentParser()
    bench_swarm.add_arguments(parser)
    args = parser.parse_args(
        [
            "--cluster",
            "--owners",
            "2",
            "--model",
            str(tiny_gguf),
            "--seconds",
            "3",
            "--policies",
            "resident",
            "--slots",
            "2",
            "--fg-interval",
            "0.1",
            "--fg-tokens",
            "4",
            "--bg-max",
            "48",
            "--prompt",
            "40",
            "--json",
        ]
    )
    with anyio.fail_after(LIMIT_S):
        assert await _bench(args) == 0
    data = json.loads(capsys.readouterr().out)
    rows = [data["policies"]["resident"], *(o["policies"]["resident"] for o in data["owners"].values())]
    assert set(data["owners"]) == {"gpu0", "gpu1"}
    for row in rows:
        assert {"fg_wait_s", "fg_ttft_s", "fg_itl_s", "fg_turn_s", "bg_tok_per_s", "preemptions", "step_s_median"} <= set(row)
        assert row["fg_turns"] > 0 and row["bg_tok_per_s"] > 0 and row["step_s_median"] > 0
    total, owners = rows[0], rows[1:]
    assert total["fg_turns"] == sum(o["fg_turns"] for o in owners)
    assert total["preemptions"] == sum(o["preemptions"] for o in owners) > 0  # each owner's slots were busy
    assert total["bg_tok_per_s"] == pytest.approx(sum(o["bg_tok_per_s"] for o in owners))
    assert data["solo"]["fg_turns"] > 0


async def test_a_cluster_passes_speculation_to_every_owner_and_refuses_a_bad_one_at_once() -> None:
    assert [spec.speculate for spec in ClusterSwarm(2, speculate="lookup").specs] == ["lookup", "lookup"]
    with pytest.raises(ConfigError, match="unknown speculation 'sometimes'"):
        ClusterSwarm(2, speculate="sometimes")
    with pytest.raises(ConfigError, match="only draft takes a model"):
        ClusterSwarm([OwnerSpec(name="gpu0", speculate="lookup:x")])
