"""A turn's update channel (runtime.actors.channel): in order, one wake-up for what is
sent together, and the memory stream's errors at either end's close."""

from __future__ import annotations

import anyio
import pytest

from runtime.actors.channel import EMPTY, open_channel
from runtime.owner.messages import TurnChannel

GUARD = 10  # seconds: a hang guard, never a threshold


@pytest.mark.anyio
async def test_items_arrive_in_order_and_a_waiting_receiver_wakes() -> None:
    send, receive = open_channel()
    got: list[int] = []

    async def read() -> None:
        async for item in receive:
            got.append(item)

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()  # the reader waits on an empty channel
            for i in range(3):
                send.send_nowait(i)
            await anyio.wait_all_tasks_blocked()
            assert got == [0, 1, 2]  # taken in one wake-up, without waiting again
            send.send_nowait(3)
            send.close()  # wakes the reader, which ends after the last item
    assert got == [0, 1, 2, 3]


@pytest.mark.anyio
async def test_take_reports_empty_then_end_of_stream() -> None:
    send, receive = open_channel()
    assert receive.take() is EMPTY
    with pytest.raises(anyio.WouldBlock):
        receive.receive_nowait()
    send.send_nowait("x")
    send.close()
    with pytest.raises(anyio.ClosedResourceError):
        send.send_nowait("y")  # its own end is closed
    assert await receive.receive() == "x"  # what was sent before the close still comes
    with pytest.raises(anyio.EndOfStream):
        receive.take()
    with pytest.raises(anyio.EndOfStream):
        await receive.receive()


@pytest.mark.anyio
async def test_a_closed_receiver_breaks_the_sender_and_drops_the_buffer() -> None:
    send, receive = open_channel()
    send.send_nowait(1)
    receive.close()
    with pytest.raises(anyio.BrokenResourceError):
        send.send_nowait(2)
    with pytest.raises(anyio.ClosedResourceError):
        receive.take()


@pytest.mark.anyio
async def test_a_receiver_cancelled_while_waiting_leaves_the_channel_usable() -> None:
    send, receive = open_channel()
    with anyio.move_on_after(0):
        await receive.receive()  # cancelled while it waits
    send.send_nowait("after")  # wakes no one, and is kept
    with anyio.fail_after(GUARD):
        assert await receive.receive() == "after"


@pytest.mark.anyio
async def test_a_turn_channel_closes_both_ends() -> None:
    channel = TurnChannel(7)
    channel.close()
    with pytest.raises(anyio.ClosedResourceError):
        channel.send.send_nowait("x")
    with pytest.raises(anyio.ClosedResourceError):
        await channel.receive.receive()


@pytest.mark.anyio
async def test_with_closes_either_end() -> None:
    send, receive = open_channel()
    with send:
        send.send_nowait(1)
    with receive:
        assert receive.take() == 1
        with pytest.raises(anyio.EndOfStream):
            receive.take()
    with pytest.raises(anyio.ClosedResourceError):
        receive.take()


@pytest.mark.anyio
async def test_wait_returns_at_once_when_take_has_an_answer() -> None:
    send, receive = open_channel()
    send.send_nowait(1)
    with anyio.fail_after(GUARD):
        await receive.wait()  # an item is there
        assert receive.take() == 1
        send.close()
        await receive.wait()  # the sender closed: take() says so
    with pytest.raises(anyio.EndOfStream):
        receive.take()
