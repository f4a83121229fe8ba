"""What a session comes to: per agent, and the foreground's waits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.base import RecordingAgent
from runtime.events.kinds import Admitted, AgentCrashed, Ended, Inherited, Preempted, Progress, Queued, Restored, Resumed, TurnEvent
from runtime.scheduling.priority import FOREGROUND


@dataclass
class AgentSummary:
    turns: int = 0
    tokens: int = 0
    paused_s: float = 0.0
    preempted: int = 0
    inherited: int = 0
    crashed: str | None = None


@dataclass
class Summary:
    agents: dict[str, AgentSummary]
    fg_wait_s: list[float]  # request to slot, turns run at foreground priority
    fg_ttft_s: list[float]  # request to first token, from the agents' records
    fg_itl_s: list[float]  # between consecutive tokens
    fg_turn_s: list[float]  # request to last token
    # The same turns alone on the idle engine, by its step cost law (empty without one)
    idle_ttft_s: list[float]
    idle_itl_s: list[float]
    idle_turn_s: list[float]
    preemptions: int
    inheritances: int
    steps: int
    seconds: float
    prompt_computed: int = 0  # prompt (and recomputed) tokens the engine prefilled
    prompt_reused: int = 0  # prompt tokens whose K/V came from the prefix cache


def summarize(events: list[Any], agents: list[Any] = (), cost: Any = None, prefill_chunk: int = 512, overhead_s: float = 0.0) -> Summary:
    """Per-agent counts from the event log; time to first token, between tokens
    and to the last from the agents' own records (events carry no per-token
    times); with the engine's step cost law (and the owner's own time per step,
    `overhead_s`), what the same turns would take on the idle engine."""
    per: dict[str, AgentSummary] = {a.name: AgentSummary() for a in agents}
    fg_wait: list[float] = []
    computed = reused = 0
    # A live turn's tokens so far (turn.progress, a pause), until its end counts
    # them: a log that stops before a turn ends still counts what it made.
    live: dict[int, tuple[str, int]] = {}
    for e in events:
        match e:
            case Ended(cached_tokens=cached, computed_tokens=prefilled):
                # (what the engine really did: a turn cancelled mid-prompt
                # computed only part of it)
                reused += cached
                computed += prefilled
        # An agent is whoever runs turns (or was given): the GPU owner, an actor
        # too, may crash but runs none.
        if isinstance(e, TurnEvent):
            s = per.setdefault(e.agent, AgentSummary())
        elif isinstance(e, (Inherited, Restored, AgentCrashed)) and e.agent in per:
            s = per[e.agent]
        else:
            continue
        match e:
            case Queued():
                s.turns += 1
            case Ended(tokens=tokens):
                s.tokens += tokens
                live.pop(e.turn, None)
            case Progress(tokens=tokens):
                live[e.turn] = (e.agent, tokens)
            case Resumed(paused_s=paused_s):
                s.paused_s += paused_s
            case Preempted(tokens=tokens):
                s.preempted += 1
                live[e.turn] = (e.agent, tokens)
            case Inherited():
                s.inherited += 1
            case AgentCrashed(reason=reason):
                s.crashed = reason
            case Admitted(priority=priority, waited_s=waited_s) if priority >= FOREGROUND and waited_s is not None:
                fg_wait.append(waited_s)
    for agent, tokens in live.values():
        per[agent].tokens += tokens
    # Agents that keep TurnRecords time from the request leaving the agent, which
    # the event log cannot (a request is logged at the next token boundary).
    records = [r for a in agents if isinstance(a, RecordingAgent) for r in a.records if r.priority >= FOREGROUND and r.ttft_s is not None]
    if records:
        fg_wait = [r.waited_s for r in records]
    ttft = [r.ttft_s for r in records]
    idle = (
        # (the same turn alone: its prompt less what the prefix cache gave it)
        [
            cost.idle_turn(r.prompt_tokens, r.tokens, prefill_chunk, overhead_s, r.cached_tokens)
            for r in records
            if r.prompt_tokens and r.tokens
        ]
        if cost
        else []
    )
    return Summary(
        agents=per,
        fg_wait_s=fg_wait,
        fg_ttft_s=ttft,
        fg_itl_s=[gap for r in records for gap in r.itl_s],
        fg_turn_s=[r.turn_s for r in records if r.turn_s is not None],
        idle_ttft_s=[i[0] for i in idle],
        idle_itl_s=[i[1] for i in idle],
        idle_turn_s=[i[2] for i in idle],
        preemptions=sum(s.preempted for s in per.values()),
        inheritances=sum(s.inherited for s in per.values()),
        steps=max((e.step for e in events), default=0),
        seconds=max((e.t for e in events), default=0.0),
        prompt_computed=computed,
        prompt_reused=reused,
    )
