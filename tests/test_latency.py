"""Latency figures come from one function (runtime.events.latency.felt): a turn's end
event and its agent's handle say the same of the same turn."""

from __future__ import annotations

import pytest
from kv_engine import KVEngine

from runtime.events.kinds import Finished
from runtime.events.latency import felt
from runtime.scheduling.priority import FOREGROUND
from swarm import Agent, Swarm


def test_felt_from_token_times():
    f = felt(1.0, [1.5, 1.75, 2.5])
    assert (f.ttft_s, f.turn_s, f.gaps_s, f.mean_gap_s) == (0.5, 1.5, [0.25, 0.75], 0.5)
    assert felt(1.0, [1.5, 1.75, 2.5], until=3.5).mean_gap_s == 1.0  # waited on to the turn's end
    assert felt(1.0, []) == felt(1.0, [], until=2.0) and felt(1.0, []).ttft_s is None
    assert felt(0.0, [0.5]).mean_gap_s is None


@pytest.mark.anyio
async def test_a_turns_end_event_and_its_handle_agree():
    async with Swarm(KVEngine(num_blocks=16, block_size=4), slots=1) as s:
        agent = await s.spawn(Agent("a", FOREGROUND))
        sub = s.bus.subscribe(max_buffer=10**6)
        async with agent.generate([5, 6, 7], max_tokens=6, ignore_eos=True) as turn:
            async for _ in turn:
                pass
        sub.close()
        ended = [e async for e in sub if isinstance(e, Finished)]
    (end,) = ended
    mine = felt(turn.queued_t, turn.token_times)
    assert turn.ttft_s == mine.ttft_s and turn.itl_s == mine.gaps_s and turn.turn_s == mine.turn_s
    # The event is stamped where the tokens are sampled, the handle where they are read:
    # the same clock, the same token times.
    assert end.ttft_s == pytest.approx(turn.ttft_s) and end.itl_s == pytest.approx(mine.mean_gap_s)
    assert end.token_s == [round(t - turn.queued_t, 4) for t in turn.token_times]
