"""The broker contract: per-run streams with ids, replay from a cursor, a bounded buffer, wake-ups."""

from __future__ import annotations

import asyncio

from threadline.broker.memory import MemoryBroker


async def _collect(broker: MemoryBroker, run_id: str, **kwargs: object) -> list[bytes]:
    return [ev.data async for ev in broker.subscribe(run_id, **kwargs)]  # type: ignore[arg-type]


async def test_replay_after_cursor_and_from_start() -> None:
    broker = MemoryBroker()
    ids = [await broker.publish("r", "values", str(i).encode()) for i in range(50)]
    await broker.end_stream("r")
    assert await _collect(broker, "r", after=ids[19]) == [str(i).encode() for i in range(20, 50)]
    assert len(await _collect(broker, "r", replay=True)) == 50
    assert await _collect(broker, "r") == []  # a join after the end sees nothing new


async def test_bounded_buffer_keeps_the_latest() -> None:
    broker = MemoryBroker(buffer_events=10)
    ids = [await broker.publish("r", "values", str(i).encode()) for i in range(50)]
    await broker.end_stream("r")
    assert await _collect(broker, "r", after=ids[4]) == [str(i).encode() for i in range(40, 50)]


async def test_live_subscriber_gets_events_in_order() -> None:
    broker = MemoryBroker()
    got = asyncio.create_task(_collect(broker, "r", replay=True))
    for i in range(5):
        await broker.publish("r", "custom", str(i).encode())
        await asyncio.sleep(0)
    await broker.end_stream("r")
    assert await got == [str(i).encode() for i in range(5)]


async def test_one_wake_up_wakes_one_waiter() -> None:
    broker = MemoryBroker()
    woke: list[int] = []

    async def waiter(i: int) -> None:
        await broker.wait_for_work(3600)
        woke.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    for _ in range(5):
        await asyncio.sleep(0)
    await broker.wake_workers()
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(woke) == 1
    await broker.wake_workers()
    await broker.wake_workers()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)  # a lost wake-up would hang here
    assert sorted(woke) == [0, 1, 2]


async def test_wake_up_before_wait_is_not_lost() -> None:
    broker = MemoryBroker()
    await broker.wake_workers()
    await asyncio.wait_for(broker.wait_for_work(3600), 10)  # a lost wake-up would hang here


async def test_cancel_sent_before_registration_is_applied() -> None:
    broker = MemoryBroker()
    await broker.send_cancel("r", "rollback")
    seen: list[str] = []
    unregister = await broker.on_cancel("r", seen.append)
    assert seen == ["rollback"]
    unregister()
