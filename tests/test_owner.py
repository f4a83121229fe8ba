"""The GPU owner and agents end to end, on the timing-model engine.

Steps are instant here, so everything is asserted in decode steps read from
the event stream, never in seconds."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest
from pausing import Pausable

from runtime.errors import TurnCancelled
from runtime.events.kinds import (
    Admitted,
    AgentCrashed,
    Cancelled,
    Ended,
    Event,
    Preempted,
    Progress,
    Queued,
    Resumed,
    SwarmStarted,
    SwarmStopped,
)
from runtime.owner.messages import Token
from runtime.scheduling.cost import StepCost
from runtime.scheduling.timing import TimingEngine
from swarm import FOREGROUND, Agent, Swarm

LONG = 1_000_000  # never ends within a test: every slot stays busy


class Recorder:
    def __init__(self, swarm: Swarm) -> None:
        self.events: list[Event] = []
        self.sub = swarm.bus.subscribe(max_buffer=10**9)

    async def until(self, predicate) -> Event:
        async for event in self.sub:
            self.events.append(event)
            if predicate(event):
                return event
        raise AssertionError("event stream ended")


async def busy(s: Swarm, name: str) -> Recorder:
    """A recorder, once a middle-priority agent `name` decodes in a slot."""
    rec = Recorder(s)
    await s.spawn(Background(name, priority=5))
    await rec.until(lambda e: isinstance(e, Admitted) and e.agent == name)
    return rec


class Background(Pausable):
    async def run(self) -> None:
        async with self.generate([1, 2, 3], max_tokens=LONG, ignore_eos=True) as turn:
            async for _ in turn:
                await anyio.sleep(0)


def swarm(slots=2, policy="resident", **kw) -> Swarm:
    return Swarm(TimingEngine(), slots=slots, policy=policy, **kw)


@pytest.mark.anyio
async def test_foreground_takes_a_slot_at_the_next_boundary_and_the_victim_is_told():
    with anyio.fail_after(30):
        async with swarm(slots=2) as s:
            rec = Recorder(s)
            bgs = [await s.spawn(Background(f"bg{i}")) for i in range(2)]
            await rec.until(lambda e: isinstance(e, Admitted) and e.agent == "bg1")
            fg = await s.spawn(Agent("pair", FOREGROUND))
            text = await fg.complete([9, 9], max_tokens=5, ignore_eos=True)
            assert text == "[1]" * 5
            await rec.until(lambda e: isinstance(e, Resumed))
            mine = {type(e): e for e in rec.events if e.agent == "pair"}
            assert mine[Admitted].step - mine[Queued].step <= 1
            (pre,) = [e for e in rec.events if isinstance(e, Preempted)]
            assert pre.by_agent == "pair" and pre.by_priority == FOREGROUND and pre.by_turn == mine[Queued].turn
            victim = next(b for b in bgs if b.name == pre.agent)
            with anyio.fail_after(5):
                while not victim.resumes:
                    await anyio.sleep(0.01)
            (pause,) = victim.pauses
            assert pause.by_agent == "pair" and pause.turn == pre.turn and pause.at_token == pre.tokens
            assert victim.resumes[0].at_token == pause.at_token and victim.resumes[0].paused_s >= 0


class Crasher(Agent):
    async def run(self) -> None:
        async with self.generate([1], max_tokens=LONG, ignore_eos=True) as turn:
            async for _ in turn:
                if len(turn.tokens) == 20:
                    raise RuntimeError("boom")


@pytest.mark.anyio
async def test_a_crashing_agent_has_its_turn_ended_and_kv_freed_and_the_swarm_goes_on():
    with anyio.fail_after(30):
        async with swarm(slots=2) as s:
            rec = Recorder(s)
            await s.spawn(Crasher("crasher"))
            crashed = await rec.until(lambda e: isinstance(e, AgentCrashed))
            assert "boom" in crashed.reason
            end = await rec.until(lambda e: isinstance(e, Ended) and e.agent == "crasher")
            assert isinstance(end, Cancelled)
            other = await s.spawn(Agent("other"))
            assert await other.complete([5], max_tokens=3, ignore_eos=True) == "[1]" * 3
            pool = s.owner.scheduler.pool
            assert pool.num_free == pool.num_blocks


@pytest.mark.anyio
async def test_leaving_a_turn_early_cancels_it_once():
    with anyio.fail_after(30):
        async with swarm(slots=1) as s:
            rec = Recorder(s)
            agent = await s.spawn(Agent("a"))
            async with agent.generate([1], max_tokens=LONG, ignore_eos=True) as turn:
                async for _ in turn:
                    if len(turn.tokens) >= 3:
                        break
            end = await rec.until(lambda e: isinstance(e, Ended))
            assert (type(end), end.reason) == (Cancelled, "left by its agent")


@pytest.mark.anyio
async def test_a_turn_that_cannot_run_fails_with_its_reason():
    with anyio.fail_after(30):
        async with Swarm(TimingEngine(num_blocks=2, block_size=4), slots=1) as s:
            agent = await s.spawn(Agent("a"))
            with pytest.raises(Exception, match="KV blocks"):
                await agent.complete([1] * 20, max_tokens=4)


@pytest.mark.anyio
async def test_stopping_the_swarm_ends_every_turn_exactly_once(tmp_path):
    path = tmp_path / "events.jsonl"
    with anyio.fail_after(30):
        async with swarm(slots=2, events=path) as s:
            rec = Recorder(s)
            for i in range(4):
                await s.spawn(Background(f"bg{i}"))
            for _ in range(4):
                await rec.until(lambda e: isinstance(e, Queued))
            pool = s.owner.scheduler.pool
        assert pool.num_free == pool.num_blocks
    from runtime.events.kinds import read_events

    events = list(read_events(path))
    queued = {e.turn for e in events if isinstance(e, Queued)}
    ends = Counter(e.turn for e in events if isinstance(e, Ended))
    assert len(queued) == 4 and all(ends[t] == 1 for t in queued)
    assert isinstance(events[0], SwarmStarted) and isinstance(events[-1], SwarmStopped)


class Reader(Agent):
    async def run(self) -> None:
        async with self.generate([1, 2, 3], max_tokens=LONG, ignore_eos=True) as turn:
            async for _ in turn:
                pass  # (no await of its own: only the turn's tokens)


@pytest.mark.anyio
async def test_stopping_the_swarm_stops_readers_whose_tokens_come_back_to_back():
    # A step that costs nothing, called inline: each reader's next token is
    # there every time it is cancelled.
    engine = TimingEngine(realtime=False)
    engine.blocking = False
    with anyio.fail_after(60):
        async with Swarm(engine, slots=8) as s:
            rec = Recorder(s)
            for i in range(16):
                await s.spawn(Reader(f"r{i}"))
            for _ in range(8):
                await rec.until(lambda e: isinstance(e, Admitted))
            stopping = s.owner.scheduler.step
        # All stop together, each within a few tokens: not one after another,
        # and not when their turns end (never).
        assert s.owner.scheduler.step - stopping <= 200
    ends = [e for e in rec.sub.take_ready() if isinstance(e, Ended)]
    assert len(ends) == 16 and all(isinstance(e, Cancelled) for e in ends)


@pytest.mark.anyio
async def test_a_cancelled_turn_raises_turn_cancelled_to_its_reader():
    with anyio.fail_after(30):
        async with swarm(slots=1) as s:
            agent = await s.spawn(Agent("a"))
            async with agent.generate([1], max_tokens=LONG, ignore_eos=True) as turn:
                with pytest.raises(TurnCancelled, match="told to stop"):
                    async for _ in turn:
                        if len(turn.tokens) == 2:
                            await s.client.cancel(turn.id, "told to stop")


class OneTurn(Agent):
    async def run(self) -> None:
        self.text = await self.complete([3], max_tokens=2, ignore_eos=True)


@pytest.mark.anyio
async def test_join_returns_when_run_ends_and_the_agent_still_answers():
    with anyio.fail_after(30):
        async with swarm(slots=1) as s:
            agent = await s.spawn(OneTurn("one"))
            await s.join(agent)
            assert agent.text == "[1][1]" and s.system.is_alive("one")


class Talker(Agent):
    async def run(self) -> None:
        await self.complete([3], max_tokens=20, ignore_eos=True)


@pytest.mark.anyio
async def test_the_cost_law_learns_every_step_while_the_next_one_runs():
    """Each step's time reaches the cost law (it refits every 16), taken in
    while the next step runs: every step is learned but the one in hand."""
    engine = TimingEngine()
    engine.cost = StepCost(0.001, 0.0001, 0.0)  # one that learns, as a real engine's
    with anyio.fail_after(30):
        async with Swarm(engine, slots=2) as s:
            for name in ("a", "b"):
                await s.spawn(Talker(name))
            for name in ("a", "b"):
                await s.join(name)
            assert s.owner.steps_run >= 20
            assert s.owner.steps_run - 1 <= engine.cost.observed <= s.owner.steps_run


class GatedEngine(TimingEngine):
    """A step runs only when the test lets it: `in_flight` says whether one is
    being held on the device right now."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.gate = threading.Semaphore(0)
        self.in_flight = threading.Event()
        self.blocking = True

    def step(self, batch, abandon=None):
        self.in_flight.set()
        self.gate.acquire()
        self.in_flight.clear()
        return super().step(batch)


@pytest.mark.asyncio
async def test_a_steps_tokens_reach_the_agent_while_the_next_step_runs():
    engine = GatedEngine()
    seen: list[bool] = []

    class Reader(Agent):
        async def run(self) -> None:
            engine.gate.release()  # the first step (prefill) may finish
            async with self.generate([1, 2, 3], max_tokens=4, ignore_eos=True) as turn:
                async for _ in turn:
                    if len(turn.tokens) < 4:
                        # Blocking the event loop on purpose: the next step can only
                        # reach the device if the owner launched it before delivering.
                        seen.append(engine.in_flight.wait(10))
                    engine.gate.release()

    with anyio.fail_after(60):
        async with Swarm(engine, slots=1) as s:
            reader = await s.spawn(Reader("reader", FOREGROUND))
            await s.join(reader)
    assert seen == [True, True, True]
    assert len(s.owner.gap_seconds) == 3


def test_bench_owner_reports_host_and_gap_time_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from swarm.cli import main

    assert main(["bench", "owner", "--steps", "40", "--repeats", "1", "--device-ms", "1", "--device-seconds", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    device = out["device"]
    assert device["steps"] >= 10 and device["step_ms"] >= 1.0 and 0 <= device["idle_ms_per_step"] <= device["idle_ms_mean"] * 100
    assert [(c["slots"], c["agents"]) for c in out["configs"]] == [(8, 8), (8, 64), (64, 64)]
    assert [(c["slots"], c["agents"]) for c in out["threaded"]] == [(8, 8), (8, 64), (64, 64)]
    for c in out["configs"] + out["threaded"]:
        assert c["steps"] >= 40 and c["steps_per_s"] > 0 and c["cpu_ms_per_step"] > 0
        assert c["gap_ms_per_step"] > 0  # (its size against host time is the machine's, not a property)
        # The agents read every token as it comes: about one per slot per step
        # (a step's tokens reach them during the next one, hence the margin).
        busy = min(c["slots"], c["agents"])
        assert 0.8 * busy <= c["tokens_read_per_step"] <= 1.2 * busy


@pytest.mark.parametrize("flag, value", [("--steps", "0"), ("--repeats", "0"), ("--device-ms", "-1"), ("--device-seconds", "0")])
def test_bench_owner_refuses_a_bad_setting_before_it_starts(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from swarm.cli import main

    assert main(["bench", "owner", flag, value]) == 2
    assert flag in capsys.readouterr().err


@pytest.mark.anyio
async def test_a_turn_left_early_ends_with_its_agents_reason_even_if_a_token_follows():
    # Leaving sends the cancel and leaves the channel open for the owner to close:
    # a token sent before the cancel is taken in must not read as a hang-up, whose
    # own cancel ("agent stopped listening") could overtake the agent's reason.
    from runtime.owner.messages import Token

    after: list[bool] = []

    class Leaver(Agent):
        async def run(self) -> None:
            async with self.generate([1, 2, 3], max_tokens=LONG, ignore_eos=True) as turn:
                async for _ in turn:
                    break
                turn.cancel_reason = "client disconnected"
                channel = turn._channel
            channel.send.send_nowait(Token(turn=turn.id, token=5, t=0.0))  # as the owner would, before the cancel lands
            after.append(True)

    with anyio.fail_after(30):
        async with swarm(slots=1) as s:
            rec = Recorder(s)
            await s.spawn(Leaver("leaver"))
            ended = await rec.until(lambda e: isinstance(e, Ended) and e.agent == "leaver")
    assert after == [True]
    assert isinstance(ended, Cancelled) and ended.reason == "client disconnected"


class ClockedEngine(TimingEngine):
    """Each step moves a virtual swarm clock on by a tenth of a second."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def step(self, batch, abandon=None):
        self.now += 0.1
        return super().step(batch, abandon)


@pytest.mark.anyio
async def test_a_running_turns_tokens_are_told_once_a_second_before_it_ends():
    """turn.progress in virtual time, a tenth of a second a step: told every ten
    steps or so, each time with more tokens, to the log but not to the turn's
    own reader (who counts its tokens)."""
    from runtime.owner.messages import TurnRequest

    engine = ClockedEngine()
    with anyio.fail_after(30):
        async with Swarm(engine, slots=1, clock=lambda: engine.now) as s:
            rec = Recorder(s)
            request = TurnRequest(agent="docs", priority=0, prompt=[1, 2, 3], max_tokens=45, ignore_eos=True)
            channel = await s.client.submit(s.client.new_turn_id(), request)
            updates = [u async for u in channel.receive]
            end = await rec.until(lambda e: isinstance(e, Ended))
    told = [e for e in rec.events if isinstance(e, Progress)]
    assert end.tokens == 45 and 4 <= len(told) <= 5
    assert all(b.tokens > a.tokens and b.t - a.t >= 1.0 - 1e-9 and b.step - a.step <= 12 for a, b in zip(told, told[1:], strict=False))
    assert told[0].tokens >= 1 and told[-1].tokens < end.tokens and told[-1].t < end.t
    assert sum(isinstance(u, Token) for u in updates) == 45 and not any(isinstance(u, Progress) for u in updates)
