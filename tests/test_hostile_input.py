"""Every public entry point, fed what a careless or hostile caller might pass: each
bad value is refused with an error from the project's own tree (runtime/errors.py),
in the caller's own code, and the swarm goes on: the GPU owner stays alive and an
innocent turn running alongside ends exactly as it would have."""

from __future__ import annotations

import math
import re

import anyio
import msgspec
import pytest
from kv_engine import KVEngine, reference_output

from runtime.actors.lock import Lock
from runtime.errors import ConfigError, SlotswarmError, TurnFailed, UsageError
from runtime.events.kinds import Ended, Failed
from runtime.owner.messages import TurnChannel, TurnRequest
from runtime.scheduling.work import Sampling
from swarm import BACKGROUND, FOREGROUND, Agent, Swarm, handler


class Ping(msgspec.Struct):
    n: int = 0


class Echo(Agent):
    @handler
    async def ping(self, msg: Ping) -> int:
        return msg.n


INNOCENT = [5, 6, 7, 8]


def calls(s: Swarm, agent: Agent):
    """(what, a call that must raise, the error it must raise)."""
    gen = agent.generate
    return [
        ("Agent priority 'high'", lambda: Agent("x", priority="high"), UsageError),
        ("Agent priority True", lambda: Agent("x", priority=True), UsageError),
        ("Agent empty name", lambda: Agent(""), UsageError),
        ("Agent name 5", lambda: Agent(5), UsageError),
        ("set priority 'high'", lambda: setattr(agent, "priority", "high"), UsageError),
        ("set priority None", lambda: setattr(agent, "priority", None), UsageError),
        ("max_tokens None", lambda: gen([1, 2], max_tokens=None), UsageError),
        ("max_tokens '5'", lambda: gen([1, 2], max_tokens="5"), UsageError),
        ("max_tokens 0", lambda: gen([1, 2], max_tokens=0), UsageError),
        ("max_tokens 2.5", lambda: gen([1, 2], max_tokens=2.5), UsageError),
        ("max_tokens True", lambda: gen([1, 2], max_tokens=True), UsageError),
        ("prompt of strings", lambda: gen(["a", "b"]), UsageError),
        ("prompt of floats", lambda: gen([1.0, 2.0]), UsageError),
        ("negative token", lambda: gen([-1]), UsageError),
        ("prompt an int", lambda: gen(123), UsageError),
        ("prompt None", lambda: gen(None), UsageError),
        ("sampling a dict", lambda: gen([1], sampling={"temperature": 1}), UsageError),
        ("ignore_eos 'yes'", lambda: gen([1], ignore_eos="yes"), UsageError),
        ("top_p None", lambda: Sampling(top_p=None), UsageError),
        ("top_p 0", lambda: Sampling(top_p=0.0), UsageError),
        ("top_p 2", lambda: Sampling(top_p=2.0), UsageError),
        ("temperature 'hot'", lambda: Sampling(temperature="hot"), UsageError),
        ("temperature nan", lambda: Sampling(temperature=math.nan), UsageError),
        ("temperature -1", lambda: Sampling(temperature=-1.0), UsageError),
        ("seed 1.5", lambda: Sampling(seed=1.5), UsageError),
        ("Swarm slots 0", lambda: Swarm(KVEngine(), slots=0), ConfigError),
        ("Swarm policy typo", lambda: Swarm(KVEngine(), policy="residnet"), ConfigError),
        ("Lock taken by 5", lambda: Lock("l").release(5), UsageError),
    ]


async def acalls(s: Swarm, agent: Agent):
    echo = s.system.ref("echo")
    return [
        ("tell a dict", lambda: s.system.tell("echo", {"n": 1}), UsageError),
        ("ask a dict", lambda: echo.ask({"n": 1}), UsageError),
        ("ask an int target", lambda: s.system.ask(5, Ping()), UsageError),
        ("ask None target", lambda: s.system.ask(None, Ping()), UsageError),
        ("ask timeout nan", lambda: echo.ask(Ping(), timeout=math.nan), UsageError),
        ("ask timeout -1", lambda: echo.ask(Ping(), timeout=-1), UsageError),
        ("ask timeout '5'", lambda: echo.ask(Ping(), timeout="5"), UsageError),
        ("agent ask timeout nan", lambda: agent.ask("echo", Ping(), timeout=math.nan), UsageError),
        ("spawn object()", lambda: s.spawn(object()), UsageError),
        ("spawn an Actor class", lambda: s.spawn(Agent), UsageError),
        ("iterate without async with", lambda: agent.generate([1, 2]).__anext__(), UsageError),
    ]


@pytest.mark.asyncio
async def test_every_public_entry_point_refuses_bad_values_from_the_tree_and_the_swarm_goes_on() -> None:
    engine = KVEngine(num_blocks=64, block_size=4)
    with anyio.fail_after(30):
        async with Swarm(engine, slots=2) as s:
            agent = await s.spawn(Agent("careless"))
            await s.spawn(Echo("echo"))
            bystander = await s.spawn(Agent("bystander", FOREGROUND))
            async with bystander.generate(INNOCENT, max_tokens=40, ignore_eos=True) as innocent:
                wrong = []
                for what, call, error in calls(s, agent):
                    try:
                        call()
                    except error as exc:
                        assert isinstance(exc, SlotswarmError), what
                    else:
                        wrong.append(f"{what}: accepted")
                for what, call, error in await acalls(s, agent):
                    try:
                        await call()
                    except error as exc:
                        assert isinstance(exc, SlotswarmError), what
                    else:
                        wrong.append(f"{what}: accepted")
                assert not wrong
                assert agent.priority == BACKGROUND  # the refused value was not kept
                # And the swarm still works, for the careless agent too.
                assert await agent.complete([3, 4], max_tokens=3, ignore_eos=True) == "".join(f"[{t}]" for t in reference_output([3, 4], 3))
                async for _ in innocent:
                    pass
            assert innocent.tokens == reference_output(INNOCENT, 40)
            assert s.system.is_alive(s.owner.name)


BAD_REQUESTS = {
    "max_tokens None": dict(max_tokens=None),
    "max_tokens '5'": dict(max_tokens="5"),
    "priority 'high'": dict(priority="high"),
    "prompt of strings": dict(prompt=["a", "b"]),
    "token outside the vocabulary": dict(prompt=[1, 10_000]),
    "sampling a dict": dict(sampling={"top_p": None}),
    "agent None": dict(agent=None),
}


@pytest.mark.parametrize("bad", list(BAD_REQUESTS), ids=list(BAD_REQUESTS))
@pytest.mark.asyncio
async def test_a_bad_request_sent_straight_to_the_owner_fails_only_its_own_turn(bad: str) -> None:
    """What Agent.generate checks, the owner checks again: anything can be put on
    its request channel."""
    engine = KVEngine(num_blocks=64, block_size=4)
    with anyio.fail_after(30):
        async with Swarm(engine, slots=4) as s:
            sub = s.bus.subscribe(max_buffer=10**6)
            bystander = await s.spawn(Agent("bystander"))
            async with bystander.generate(INNOCENT, max_tokens=30, ignore_eos=True) as innocent:
                fields = dict(agent="evil", priority=FOREGROUND, prompt=[1, 2], max_tokens=5)
                fields.update(BAD_REQUESTS[bad])
                channel = TurnChannel(s.client.new_turn_id())
                await s.system.tell(s.owner, TurnRequest(**fields, reply=channel))
                await s.system.tell(s.owner, TurnRequest(**fields))  # no reply address at all
                with channel.receive:
                    *_, end = [u async for u in channel.receive]
                assert isinstance(end, Failed)
                async for _ in innocent:
                    pass
            assert innocent.tokens == reference_output(INNOCENT, 30)
            assert s.system.is_alive(s.owner.name)
            # A later turn still runs, and every turn ended exactly once.
            assert await bystander.complete([9], max_tokens=2, ignore_eos=True)
        ends = [e async for e in sub if isinstance(e, Ended)]
        assert sorted(e.turn for e in ends) == sorted({e.turn for e in ends})
        assert [type(e) for e in ends if e.turn == channel.turn_id] == [Failed]


@pytest.mark.asyncio
async def test_an_engine_fault_fails_only_the_turn_that_causes_it() -> None:
    engine = KVEngine(num_blocks=64, block_size=4)
    with anyio.fail_after(30):
        async with Swarm(engine, slots=4) as s:
            a, b = await s.spawn(Agent("a")), await s.spawn(Agent("b"))
            async with a.generate(INNOCENT, max_tokens=30, ignore_eos=True) as innocent:
                async with b.generate([9, 9], max_tokens=30, ignore_eos=True) as doomed:
                    engine.fail_next("step", doomed.id, why="this turn's fault", times=1000)
                    with pytest.raises(TurnFailed, match="this turn's fault"):
                        async for _ in doomed:
                            pass
                async for _ in innocent:
                    pass
            assert innocent.tokens == reference_output(INNOCENT, 30)
            assert s.system.is_alive(s.owner.name)


# ------------------------------------------------------------ session files

BAD_SESSIONS = {
    "duplicate agent names": ('[[agents]]\nclass = "docs"\n[[agents]]\nclass = "reviewer"\nname = "docs"\n', "line 5"),
    "duplicate default names": ('[[agents]]\nclass = "reviewer"\n[[agents]]\nclass = "reviewer"\n', "line 4"),
    "duration nan": ("duration = nan\n", "duration"),
    "duration negative": ("duration = -5\n", "duration"),
    "interval negative": ("interval = -1\n", "interval"),
    "turns negative": ("turns = -2\n", "turns"),
    "step_tokens 0": ("step_tokens = 0\n", "step_tokens"),
    "slots 0": ("slots = 0\n", "slots"),
    "slack nan": ("slack = nan\n", "slack"),
    "empty agent name": ('[[agents]]\nclass = "docs"\nname = ""\n', "name"),
}


@pytest.mark.parametrize("bad", list(BAD_SESSIONS), ids=list(BAD_SESSIONS))
def test_a_session_file_that_would_crash_swarm_run_is_refused_naming_the_field(bad: str, tmp_path) -> None:
    from swarm.session import parse_session

    text, mention = BAD_SESSIONS[bad]
    with pytest.raises(ConfigError, match=mention):
        parse_session(text, base=tmp_path)


@pytest.mark.parametrize(
    "options, says",
    [
        ('{ max_tokens = "5" }', "Expected `int`, got `str`"),
        ("{ max_tokens = 0 }", "max_tokens must be an int >= 1"),
        ("{ max_tokens = true }", "Expected `int`, got `bool`"),
    ],
)
def test_a_bad_max_tokens_in_a_session_files_options_is_refused_at_start(options: str, says: str, tmp_path) -> None:
    from swarm.runner import SessionRunner
    from swarm.session import parse_session

    session = parse_session(f'[[agents]]\nclass = "docs"\n[[agents]]\nclass = "reviewer"\noptions = {options}\n', base=tmp_path)
    with pytest.raises(ConfigError, match=r"line 5: agents\[1\] .*" + re.escape(says)):
        SessionRunner(session, out=tmp_path / "out")


def test_swarm_run_on_a_bad_session_file_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    from swarm.cli import main

    path = tmp_path / "s.toml"
    path.write_text('[[agents]]\nclass = "docs"\n[[agents]]\nclass = "docs"\n')
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give each agent its own name" in err and "Traceback" not in err


# ------------------------------------------------------------ private files


def test_the_event_log_and_an_agents_proposals_are_private(tmp_path) -> None:
    import os
    import stat

    from agents import DocWriter
    from runtime.events.bus import EventBus

    old = os.umask(0o022)  # the usual umask, which would make them 0644
    try:
        bus = EventBus()
        log = bus.log_to_file(tmp_path / "run" / "events.jsonl")
        bus.close()
        agent = DocWriter("docs", workspace=tmp_path, out=tmp_path / "out")
        proposal = agent._write(tmp_path / "out" / "docs" / "sub" / "a.py.md", "text")
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(log) == 0o600 and mode(proposal) == 0o600
    assert mode(tmp_path / "run") == 0o700 and mode(proposal.parent) == 0o700 and mode(tmp_path / "out") == 0o700


@pytest.mark.asyncio
async def test_if_the_owner_dies_of_a_bug_no_agent_is_left_waiting(monkeypatch) -> None:
    engine = KVEngine(num_blocks=64, block_size=4)
    with anyio.fail_after(30):
        async with Swarm(engine, slots=2) as s:
            agent = await s.spawn(Agent("a"))

            def broken(*args, **kwargs):
                raise RuntimeError("a bug in the scheduler")

            monkeypatch.setattr(s.owner.scheduler, "schedule", broken)
            monkeypatch.setattr(s.owner.scheduler, "cancel", broken)  # and on_stop's cleanup fails too
            with pytest.raises(TurnFailed):
                await agent.complete([5, 6], max_tokens=3)
