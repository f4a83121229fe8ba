"""What a turn's reader felt, from when it asked: the one place latency
figures are computed from a turn's token times, for the turn's end event
(runtime.scheduling.scheduler) and for its agent (runtime.agent.TurnHandle) alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Felt:
    ttft_s: float | None  # the request to the first token
    turn_s: float | None  # the request to the last token
    mean_gap_s: float | None  # the mean of the gaps, to `until` when given (a turn's end)
    token_times: tuple[float, ...] = ()

    @property
    def gaps_s(self) -> list[float]:
        """Between consecutive tokens, pauses included: made when asked (every
        turn's end event asks for the figures above, few readers for these)."""
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]


def felt(asked: float, token_times: Sequence[float], until: float | None = None) -> Felt:
    """Latencies of tokens sampled at `token_times` for a request made at
    `asked` (one clock). `until`, the turn's end, stands for its last token in
    the mean gap: a turn cancelled after its last token was still waited on."""
    if not token_times:
        return Felt(None, None, None)
    first, last = token_times[0], token_times[-1]
    n = len(token_times)
    return Felt(
        ttft_s=first - asked,
        turn_s=last - asked,
        mean_gap_s=((last if until is None else until) - first) / (n - 1) if n > 1 else None,
        token_times=tuple(token_times),
    )
