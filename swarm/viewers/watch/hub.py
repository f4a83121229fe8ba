"""The hub between one event source and any number of open pages.

Events go into one shared history, once, already framed for the wire (each JSON
line of the stream schema, runtime/events/kinds.py, as one `data:` line of a server-sent
event). Each page reads that history with its own cursor, so publishing costs the
same whether no page or a hundred are open, a page that opens late still sees the
session from its start, and a page that stops reading only falls behind: nothing
is buffered per page and nothing waits on one. The history is bounded (in events
and in bytes); a page whose cursor fell off its start is told how many events it
lost, as `{"event": "events.dropped", "count": N}`, the notice the live socket
sends.

Live, pages get the events in batches, each one server-sent event holding every
event since the last (a `data:` line each, so the page splits the message on
newlines): once a second (`BATCH_S`), or within `MARK_S` when the news holds a
new mark for the lanes (a pause, an inheritance, a loss), which the page then
draws at once. Every
page wakes at the same instants of the clock, so pages that are up to date take
the same batch, which is built once and shared by all of them. However fast the
swarm emits, a page then wakes and parses about once a second (and draws at most
that often), which is what lets a browser with fifty pages open share a small
machine with the swarm: every message and every frame costs its renderer a
millisecond or more.

Each swarm is one generation. A `swarm.started` from a different swarm (another
`unix_time`) starts a new one: the history is cleared and every page is told to
start over. The same swarm seen again (the socket reconnected) is a gap, not a
new session.

On the wire each batch has the id `<hub>.<generation>-<seq>` of its last event
(`<hub>` is random per hub, so ids of a restarted server never match old ones), so
a page that reconnects (EventSource sends `Last-Event-ID`) resumes exactly where
it was when its generation is still current, and starts over otherwise. Named
events carry the hub's own news: `hello` (mode, source), `reset` (a new
generation), `status` (where the source stands). Unnamed events are batches of
the stream's JSON lines; the page ignores kinds it does not know.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator

import anyio
import msgspec

from runtime.events.kinds import Dropped, Inherited, Preempted, SwarmStarted, decode

# Events kept for pages that open late: a few hundred bytes each, more for the end
# of a foreground turn (its token times), so bytes are bounded too.
MAX_HISTORY = 100_000
MAX_HISTORY_BYTES = 64 << 20
# Live events wait at most this long to go out together, in one message to each
# page; a new mark, at most MARK_S (a pause shows well within a second). Every
# fourth boundary of MARK_S is one of BATCH_S, where a mark costs no message of its own.
BATCH_S = 1.0
MARK_S = 0.25
# Events in one message at most: a page catching up on a long history gets it in
# pieces it can apply between frames.
MAX_BATCH = 2000
MAX_SHARED = 64  # batches kept for other pages at once (pages far apart build their own)
# How often an idle stream sends a comment, so dead connections are noticed.
KEEPALIVE_S = 15.0
# How long the browser waits before reconnecting after the stream broke.
RETRY_MS = 1000
# Events were lost in a number nobody knows (the source reconnected meanwhile).
GAP = b'{"event":"events.dropped","count":null}'
_STARTED = SwarmStarted.__struct_config__.tag.encode()
_MARKS = tuple(b'"event":"%s"' % kind.__struct_config__.tag.encode() for kind in (Preempted, Inherited, Dropped))


class WatchHub:
    """Collects one source's events and serves them to pages.

    `mode` is "live" (follow as events arrive) or "replay" (the page gets the
    whole recording and plays it back with its own clock)."""

    def __init__(self, *, mode: str = "live", source: str = "", max_history: int = MAX_HISTORY, max_bytes: int = MAX_HISTORY_BYTES) -> None:
        self.mode = mode
        self.source = source
        self.max_history = max_history
        self.max_bytes = max_bytes
        self.generation = 0
        self._name = secrets.token_hex(4)
        self.base = 0  # seq of history[0]: older events were trimmed away
        self.history: list[bytes] = []  # `data: <line>\n` each
        self._bytes = 0
        self.status = {"text": "waiting for events", "live": False}
        self._started_at: float | None = None  # unix_time of this generation's swarm
        self._changed = anyio.Event()
        self._marked = anyio.Event()  # set when a mark is published (or the hub closes)
        self._last_mark = 0  # seq of the newest mark in this generation
        self.closed = False
        self.readers = 0  # pages reading now
        self.batches_built = 0  # distinct batches framed (pages that read together share one)
        # Batches framed since the history last changed, by cursor, for the next page there.
        self._batches: dict[int, tuple[bytes, int]] = {}
        self._batches_of: tuple[int, int, int] = (0, 0, 0)  # (generation, base, published) they were framed from

    @property
    def published(self) -> int:
        """Events published in this generation (the seq of the newest)."""
        return self.base + len(self.history)

    # ------------------------------------------------------------ publishing

    def publish(self, line: bytes) -> None:
        """One JSON line of the event stream (its trailing newline optional)."""
        line = line.rstrip(b"\n")
        if _STARTED in line and self._seen_before(line):
            line = GAP
        item = b"data: " + line + b"\n"
        self.history.append(item)
        self._bytes += len(item)
        if len(self.history) > self.max_history or self._bytes > self.max_bytes:
            self._trim()
        if any(mark in line for mark in _MARKS):
            self._last_mark = self.published
            self._marked.set()
            self._marked = anyio.Event()
        self._wake()

    def _trim(self) -> None:
        # A tenth at a time, so trimming is rare.
        while self.history and (len(self.history) > self.max_history or self._bytes > self.max_bytes):
            cut = max(1, len(self.history) // 10)
            self._bytes -= sum(map(len, self.history[:cut]))
            del self.history[:cut]
            self.base += cut

    def set_status(self, text: str, *, live: bool) -> None:
        status = {"text": text, "live": live}
        if status != self.status:
            self.status = status
            self._wake()

    def close(self) -> None:
        """No more events: streams end once their pages have read everything."""
        self.closed = True
        self._marked.set()
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
        self._bytes = 0
        self._last_mark = 0
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
                if cursor < self.published:  # (or behind the history's start: told so in the batch)
                    batch, cursor = self._take(generation, cursor)
                    yield batch
                    continue
                if self.closed:
                    return
                with anyio.move_on_after(KEEPALIVE_S) as waited:
                    await changed.wait()
                if waited.cancelled_caught:
                    yield b": keepalive\n\n"
                elif self.mode == "live":
                    await self._hold(generation, cursor)
        finally:
            self.readers -= 1

    async def _hold(self, generation: int, cursor: int) -> None:
        """Wait for the batch's moment, so that the news of the next moment joins
        it: the next whole BATCH_S of the clock, or the next MARK_S once a mark is
        among the news. Every page wakes at the same instants, so the pages that
        keep up take the same batch."""
        while True:
            marked = self._marked
            urgent = self.closed or generation != self.generation or self._last_mark > cursor
            period = MARK_S if urgent else BATCH_S
            wait = period - anyio.current_time() % period
            if urgent:
                if not self.closed:
                    await anyio.sleep(wait)
                return
            with anyio.move_on_after(wait) as held:
                await marked.wait()
            if held.cancelled_caught:
                return

    def _take(self, generation: int, cursor: int) -> tuple[bytes, int]:
        """One message: the events after `cursor` (at most MAX_BATCH), preceded by a
        drop notice if some fell off the history; and the cursor after them."""
        state = (generation, self.base, self.published)
        if state != self._batches_of or len(self._batches) >= MAX_SHARED:
            self._batches, self._batches_of = {}, state
        if cursor in self._batches:
            return self._batches[cursor]
        start = cursor
        parts = []
        if cursor < self.base:
            parts.append(b'data: {"event":"events.dropped","count":%d}\n' % (self.base - cursor))
            cursor = self.base
        end = min(self.published, cursor + MAX_BATCH)
        parts += self.history[cursor - self.base : end - self.base]
        parts.append(b"id: " + self._id(generation, end).encode() + b"\n\n")
        self._batches[start] = batch = (b"".join(parts), end)
        self.batches_built += 1
        return batch

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
