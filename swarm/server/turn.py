"""One HTTP request's turn, as the text its client is sent.

Stop strings are found in the text as it streams, and any tail that could be the
start of one is held back, so no part of a stop string is ever sent; a match
ends the turn (it is cancelled at the next token boundary, reason "stop
string"). Time to first token and inter-token latency are observed here, where
the caller sees them, and `usage()` adds slotswarm's own timings to OpenAI's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.agent import TurnHandle
from runtime.errors import TurnCancelled, TurnFailed
from swarm.server.protocol import TurnSpec

if TYPE_CHECKING:
    from swarm.server.gateway import Caller, Gateway

FINISH_REASONS = {"eos": "stop", "length": "length", "context": "length"}


class StopScanner:
    """Finds stop strings in streamed text, holding back any tail that could be
    the start of one, so no part of a stop string is ever sent."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = ""
        self.hit = False

    def push(self, piece: str) -> str:
        if not self.stops:
            return piece
        self.pending += piece
        found = [i for s in self.stops if (i := self.pending.find(s)) >= 0]
        if found:
            out, self.pending, self.hit = self.pending[: min(found)], "", True
            return out
        keep = 0
        for k in range(min(len(self.pending), max(map(len, self.stops)) - 1), 0, -1):
            if any(s.startswith(self.pending[-k:]) for s in self.stops):
                keep = k
                break
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep :]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class ServedTurn:
    """One request's turn, as text: iterate it for the pieces to send. Afterwards
    `finish_reason` and `usage()` say how it ended."""

    def __init__(self, gateway: Gateway, caller: Caller, handle: TurnHandle, spec: TurnSpec, arrived: float) -> None:
        self.gateway = gateway
        self.caller = caller
        self.handle = handle
        self.spec = spec
        self.arrived = arrived
        self.scanner = StopScanner(spec.stop)
        self.finish_reason: str | None = None
        self.text: list[str] = []
        self._last: float | None = None  # when the last piece went out
        self._counted = 0  # tokens counted in the metrics so far
        self._done = False

    def __aiter__(self) -> ServedTurn:
        return self

    async def __anext__(self) -> str:
        while not self._done:
            try:
                piece = await self.handle.__anext__()
            except StopAsyncIteration:
                self._done = True
                ended = self.handle.ended
                self.finish_reason = FINISH_REASONS.get(ended.reason, "stop") if ended else "stop"
                piece = self.scanner.flush()
                if piece:
                    return self._out(piece)
                break
            except (TurnCancelled, TurnFailed) as exc:
                self._done = True
                raise self.gateway.ended_early(self.handle, exc) from None
            text = self.scanner.push(piece)
            if self.scanner.hit:
                self._done = True
                self.finish_reason = "stop"
                self.handle.cancel_reason = "stop string"
            if text:
                return self._out(text)
        raise StopAsyncIteration

    def _out(self, text: str) -> str:
        now = self.gateway.clock()
        metrics = self.gateway.metrics
        if metrics is not None:
            metrics.tokens.labels(self.caller.klass).inc(len(self.handle.tokens) - self._counted)
            self._counted = len(self.handle.tokens)
            if self._last is None:
                metrics.ttft.labels(self.caller.klass).observe(now - self.arrived)
            else:
                metrics.itl.labels(self.caller.klass).observe(now - self._last)
        self._last = now
        self.text.append(text)
        return text

    def usage(self) -> dict[str, Any]:
        h = self.handle
        prompt, completion = len(h.prompt), len(h.tokens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": h.cached_tokens},
            "waited_s": h.waited_s,
            "ttft_s": h.ttft_s,
            "paused_s": h.paused_s,
            "preemptions": len(h.pauses),
        }
