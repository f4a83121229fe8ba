"""The GPU owner's step thread: the one thread engine steps run in, handed a
step at a time. (An engine whose steps never block is called inline instead:
`StepThread(name, inline=True)` runs each job as it is handed over.)

A step's device work blocks, so it runs off the event loop, while the loop
delivers the previous step's tokens. A ThreadPoolExecutor awaited through
asyncio.wrap_future would cost two futures, a lock and a chain of done-callbacks
per step, a notable share of the owner's host time; here, on asyncio, the thread
sets the awaiting future itself with one call_soon_threadsafe. On another event loop
(trio) the owner waits for a plain Future in a worker thread, as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio

T = TypeVar("T")
A = TypeVar("A")


class Job(Generic[T]):
    """One call handed to the step thread; `await job.result()` for its return."""

    def __init__(self, fn: Callable[[Any], T], arg: Any) -> None:
        self._fn, self._arg = fn, arg
        self._loop: asyncio.AbstractEventLoop | None
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # another anyio backend
            self._loop = None
            self._done: concurrent.futures.Future[T] = concurrent.futures.Future()
        else:
            self._future: asyncio.Future[T] = self._loop.create_future()
        self._outcome: tuple[Any, BaseException | None] | None = None  # once settled, on asyncio

    def run(self, *, inline: bool = False) -> None:
        """In the step thread; or `inline`, on the event loop's own thread."""
        try:
            result, error = self._fn(self._arg), None
        except BaseException as exc:  # (handed to whoever awaits the step, as a Future would)
            result, error = None, exc
        # What it was handed may hold the job in turn (a StepInFlight does): let go
        # of it, so the pair is freed by reference counting, not the cycle collector.
        self._fn = self._arg = None  # type: ignore[assignment]
        if inline and self._loop is not None:
            self._settle(result, error)
            return
        if self._loop is None:
            if error is None:
                self._done.set_result(result)  # type: ignore[arg-type]
            else:
                self._done.set_exception(error)
            return
        try:
            self._loop.call_soon_threadsafe(self._settle, result, error)
        except RuntimeError:
            pass  # the event loop has closed: nobody waits for this step any more

    def _settle(self, result: Any, error: BaseException | None) -> None:
        self._outcome = (result, error)
        if self._future.done():  # the waiter was cancelled
            return
        if error is None:
            self._future.set_result(result)
        else:
            self._future.set_exception(error)

    async def result(self) -> T:
        """What the call returned (or its exception, raised). A wait cancelled
        leaves the job as it is: awaited again, it gives the same outcome."""
        if self._loop is None:
            if self._done.done():
                return self._done.result()
            return await anyio.to_thread.run_sync(self._done.result)  # (not cancellable)
        if self._future.cancelled():  # an earlier wait was cancelled
            if self._outcome is None:
                self._future = self._loop.create_future()  # for _settle to set
            else:
                result, error = self._outcome
                if error is not None:
                    raise error
                return result  # type: ignore[no-any-return]
        return await self._future


class StepThread:
    """`with StepThread(name) as device: job = device.submit(fn, arg)`. Leaving
    the block waits for the job in hand, as ThreadPoolExecutor's does. With
    `inline`, there is no thread: `submit` runs the job before it returns."""

    def __init__(self, name: str, *, inline: bool = False) -> None:
        self.inline = inline
        self._jobs: queue.SimpleQueue[Job[Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def __enter__(self) -> StepThread:
        if not self.inline:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.inline:
            self._jobs.put(None)
            self._thread.join()

    def submit(self, fn: Callable[[A], T], arg: A) -> Job[T]:
        job = Job(fn, arg)
        if self.inline:
            job.run(inline=True)
        else:
            self._jobs.put(job)
        return job

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            job.run()
