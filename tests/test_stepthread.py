"""The owner's step thread (runtime.owner.stepthread): a step's result or error comes
back to the awaiting task, on asyncio and trio, and every step runs in the one
thread, in order."""

from __future__ import annotations

import threading

import anyio
import pytest

from runtime.owner.stepthread import StepThread

GUARD = 10  # seconds: a hang guard, never a threshold


@pytest.mark.anyio
async def test_steps_run_in_one_thread_in_order_and_return_or_raise() -> None:
    ran: list[tuple[int, str]] = []

    def step(i: int) -> int:
        ran.append((i, threading.current_thread().name))
        if i == 2:
            raise ValueError("bad step")
        return i * 10

    with anyio.fail_after(GUARD), StepThread("gpu-step") as device:
        jobs = [device.submit(step, i) for i in range(4)]  # handed on before any is awaited
        assert await jobs[0].result() == 0
        assert await jobs[1].result() == 10
        with pytest.raises(ValueError, match="bad step"):
            await jobs[2].result()
        assert await jobs[3].result() == 30
    assert ran == [(i, "gpu-step") for i in range(4)]


@pytest.mark.anyio
@pytest.mark.parametrize("settled_first", [True, False], ids=["settled-before-awaited-again", "settled-after"])
async def test_a_cancelled_wait_leaves_the_job_to_be_awaited_again(settled_first: bool) -> None:
    # The owner takes a step in even when cancelled while it runs: its wait is
    # cancelled, the job is not, and waiting again gives what the step returned.
    gate = threading.Event()

    def step(i: int) -> int:
        if not gate.wait(GUARD):
            raise AssertionError("the step was never let go")
        return i * 10

    with anyio.fail_after(GUARD), StepThread("gpu-step") as device:
        job = device.submit(step, 4)
        with anyio.move_on_after(0):  # cancelled at once, while the step waits
            await job.result()
        gate.set()
        if settled_first:
            done = device.submit(lambda _: None, None)  # runs after the step: the step has settled
            await done.result()
        assert await job.result() == 40


@pytest.mark.anyio
async def test_inline_jobs_run_as_they_are_handed_over_on_the_callers_thread() -> None:
    # An engine whose steps never block is called inline (runtime.scheduling.work's
    # `blocking`): no thread, each job done before submit returns.
    ran: list[str] = []

    def step(i: int) -> int:
        ran.append(threading.current_thread().name)
        if i == 2:
            raise ValueError("bad step")
        return i * 10

    with anyio.fail_after(GUARD), StepThread("gpu-step", inline=True) as device:
        jobs = [device.submit(step, i) for i in range(3)]
        assert ran == [threading.current_thread().name] * 3  # all done already
        assert await jobs[0].result() == 0 and await jobs[1].result() == 10
        with pytest.raises(ValueError, match="bad step"):
            await jobs[2].result()
