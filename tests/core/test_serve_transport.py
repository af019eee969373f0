"""`core.serve.LoopPipeTransport`: answers from another process arrive on the event loop, in order, none lost."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time

from core.serve import LoopPipeTransport, _pipe_queue


def _send(queue, n: int, pause_every: int) -> None:
    for i in range(n):
        queue.put((f"uid{i}", i))
        if pause_every and i % pause_every == 0:
            time.sleep(0.002)  # let the reader drain the pipe and wait again


async def _receive_all(transport: LoopPipeTransport, n: int) -> list:
    got = []
    while len(got) < n:
        item = await transport.areceive(0, timeout=5)
        if item is not None:
            got.append(item)
    return got


def test_every_answer_from_another_process_arrives_in_order():
    queue = _pipe_queue()
    transport = LoopPipeTransport(None, [queue])
    sender = mp.get_context("spawn").Process(target=_send, args=(queue, 2000, 97))
    sender.start()
    try:
        got = asyncio.run(asyncio.wait_for(_receive_all(transport, 2000), 60))
    finally:
        sender.join(30)
    assert got == [(f"uid{i}", i) for i in range(2000)]


def test_a_quiet_queue_times_out_with_none_and_the_loop_stays_free():
    transport = LoopPipeTransport(None, [_pipe_queue()])

    async def main() -> tuple[object, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        result = await transport.areceive(0, timeout=0.3)
        task.cancel()
        return result, ticks

    result, ticks = asyncio.run(main())
    assert result is None
    assert ticks >= 10  # the wait did not block the event loop (a blocking get would leave 1 tick)


def test_a_closed_transport_cancels_the_reader():
    transport = LoopPipeTransport(None, [_pipe_queue()])
    transport.close(send_sentinel=False)
    try:
        asyncio.run(transport.areceive(0, timeout=0.1))
    except asyncio.CancelledError:
        return
    raise AssertionError("areceive on a closed transport should be cancelled")


def test_the_http_processes_rebuild_the_same_transport():
    transport = LoopPipeTransport(None, [_pipe_queue()])
    cls, args = transport.__reduce__()
    assert cls is LoopPipeTransport and args[1] is transport._queues
