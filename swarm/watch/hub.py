"""The hub between one event source and any number of open pages.

Events go into one shared history, once, as the JSON lines of the stream schema
(runtime/events.py). Each page reads that history with its own cursor, so
publishing costs the same whether no page or a hundred are open, a page that
opens late still sees the session from its start, and a page that stops reading
only falls behind: nothing is buffered per page and nothing waits on one. The
history is bounded; a page whose cursor fell off its start is told how many
events it lost, as `{"event": "events.dropped", "count": N}`, the notice the
live socket sends.

Each swarm is one generation. A `swarm.started` from a different swarm (another
`unix_time`) starts a new one: the history is cleared and every page is told to
start over. The same swarm seen again (the socket reconnected) is a gap, not a
new session.

On the wire (server-sent events) each item has the id `<hub>.<generation>-<seq>`
(`<hub>` is random per hub, so ids of a restarted server never match old ones), so
a page that reconnects (EventSource sends `Last-Event-ID`) resumes exactly where
it was when its generation is still current, and starts over otherwise. Named
events carry the hub's own news: `hello` (mode, source), `reset` (a new
generation), `status` (where the source stands). Unnamed events are the stream's
JSON lines; the page ignores kinds it does not know.
"""

from __future__ import annotations

import json
import secrets
from typing import AsyncIterator

import anyio
import msgspec

from runtime.events import SwarmStarted, decode

# Events kept for pages that open late. A few hundred bytes each: ~25 MB at most.
MAX_HISTORY = 100_000
# How often an idle stream sends a comment, so dead connections are noticed.
KEEPALIVE_S = 15.0
# How long the browser waits before reconnecting after the stream broke.
RETRY_MS = 1000
# Events were lost in a number nobody knows (the source reconnected meanwhile).
GAP = b'{"event":"events.dropped","count":null}'
_STARTED = SwarmStarted.__struct_config__.tag.encode()


class WatchHub:
    """Collects one source's events and serves them to pages.

    `mode` is "live" (follow as events arrive) or "replay" (the page gets the
    whole recording and plays it back with its own clock)."""

    def __init__(self, *, mode: str = "live", source: str = "", max_history: int = MAX_HISTORY) -> None:
        self.mode = mode
        self.source = source
        self.max_history = max_history
        self.generation = 0
        self._name = secrets.token_hex(4)
        self.base = 0  # seq of history[0]: older events were trimmed away
        self.history: list[bytes] = []
        self.status = {"text": "waiting for events", "live": False}
        self._started_at: float | None = None  # unix_time of this generation's swarm
        self._changed = anyio.Event()
        self.closed = False
        self.readers = 0  # pages reading now

    # ------------------------------------------------------------ publishing

    def publish(self, line: bytes) -> None:
        """One JSON line of the event stream (its trailing newline optional)."""
        line = line.rstrip(b"\n")
        if _STARTED in line and self._seen_before(line):
            line = GAP
        self.history.append(line)
        if len(self.history) > self.max_history:
            # Trim a tenth at a time, so trimming is rare.
            cut = max(1, self.max_history // 10)
            del self.history[:cut]
            self.base += cut
        self._wake()

    def set_status(self, text: str, *, live: bool) -> None:
        status = {"text": text, "live": live}
        if status != self.status:
            self.status = status
            self._wake()

    def close(self) -> None:
        """No more events: streams end once their pages have read everything."""
        self.closed = True
        self._wake()

    def _seen_before(self, line: bytes) -> bool:
        """Whether this swarm.started is the current swarm's, seen again after the
        source reconnected; if not, a new generation begins."""
        try:
            started = decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        if not isinstance(started, SwarmStarted):
            return False
        unix_time = started.unix_time
        if unix_time is not None and unix_time == self._started_at:
            return True
        self._started_at = unix_time
        self.generation += 1
        self.base = 0
        self.history = []
        return False

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # --------------------------------------------------------------- serving

    async def stream(self, last_event_id: str | None = None) -> AsyncIterator[bytes]:
        """The server-sent event stream for one page, resuming after
        `last_event_id` where it can."""
        self.readers += 1
        try:
            yield _frame(json.dumps({"mode": self.mode, "source": self.source}), event="hello", retry=RETRY_MS)
            generation, cursor = self._resume_point(last_event_id)
            status = None
            while True:
                changed = self._changed  # taken before reading, so no wake-up is missed
                if generation != self.generation:
                    generation, cursor = self.generation, self.base
                    yield _frame(json.dumps({"generation": generation}), event="reset")
                if status != self.status:
                    status = self.status
                    yield _frame(json.dumps(status), event="status")
                if cursor < self.base:
                    lost = self.base - cursor
                    cursor = self.base
                    yield _frame(f'{{"event":"events.dropped","count":{lost}}}', id=self._id(generation, cursor))
                if cursor < self.base + len(self.history):
                    # Everything new in one write: a page that fell behind catches up in one go.
                    items = self.history[cursor - self.base :]
                    chunk = b"".join(
                        _frame_bytes(line, self._id(generation, cursor + i + 1)) for i, line in enumerate(items)
                    )
                    cursor += len(items)
                    yield chunk
                    continue
                if self.closed:
                    return
                with anyio.move_on_after(KEEPALIVE_S) as waited:
                    await changed.wait()
                if waited.cancelled_caught:
                    yield b": keepalive\n\n"
        finally:
            self.readers -= 1

    def _id(self, generation: int, seq: int) -> str:
        return f"{self._name}.{generation}-{seq}"

    def _resume_point(self, last_event_id: str | None) -> tuple[int, int]:
        """(generation, cursor) after the item a reconnecting page saw last;
        generation -1 (start over) when that cannot be done."""
        prefix, _, seq = (last_event_id or "").rpartition("-")
        if prefix != f"{self._name}.{self.generation}" or not seq.isdigit():
            return -1, 0
        if int(seq) > self.base + len(self.history):
            return -1, 0
        return self.generation, int(seq)


def _frame(data: str, *, event: str | None = None, id: str | None = None, retry: int | None = None) -> bytes:
    head = ""
    if retry is not None:
        head += f"retry: {retry}\n"
    if event is not None:
        head += f"event: {event}\n"
    if id is not None:
        head += f"id: {id}\n"
    return f"{head}data: {data}\n\n".encode()


def _frame_bytes(line: bytes, id: str) -> bytes:
    # A JSON line holds no raw newline, so it is one `data:` field as it is.
    return b"id: " + id.encode() + b"\ndata: " + line + b"\n\n"
