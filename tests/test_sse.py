"""api/sse.Pump: a stream's events read ahead, taken in batches, bounded by bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from threadline.api.sse import Pace, Pump, frame_bytes
from threadline.broker.base import StreamEvent


def _ev(i: int, size: int = 10) -> StreamEvent:
    return StreamEvent(f"1-{i}", "custom", b"x" * size)


async def test_what_is_ready_is_taken_in_one_batch_in_order() -> None:
    async def events() -> AsyncIterator[StreamEvent]:
        for i in range(5):
            yield _ev(i)
        await asyncio.sleep(0.01)
        yield _ev(5)

    pump = Pump(events())
    await asyncio.sleep(0)  # the reader runs until the events pause
    assert [e.id for e in await pump.take()] == [f"1-{i}" for i in range(5)]
    assert [e.id for e in await pump.take()] == ["1-5"]
    assert await pump.take() == []  # the end
    pump.close()


async def test_reading_stops_at_the_byte_bound_until_the_response_takes() -> None:
    read = 0

    async def events() -> AsyncIterator[StreamEvent]:
        nonlocal read
        for i in range(100):
            read += 1
            yield _ev(i, size=Pump.max_bytes // 4)

    pump = Pump(events())
    for _ in range(10):
        await asyncio.sleep(0)
    assert read == 4  # a slow client holds at most max_bytes here; the rest waits in the broker's buffer
    assert len(await pump.take()) == 4
    for _ in range(10):
        await asyncio.sleep(0)
    assert read == 8
    pump.close()


async def test_an_error_comes_after_the_events_read_before_it() -> None:
    async def events() -> AsyncIterator[StreamEvent]:
        yield _ev(0)
        raise RuntimeError("broker gone")

    pump = Pump(events())
    await asyncio.sleep(0)
    assert [e.id for e in await pump.take()] == ["1-0"]
    with pytest.raises(RuntimeError, match="broker gone"):
        await pump.take()
    pump.close()


async def test_close_ends_the_events_generator() -> None:
    closed = asyncio.Event()

    async def events() -> AsyncIterator[StreamEvent]:
        try:
            yield _ev(0)
            await asyncio.sleep(3600)
        finally:
            closed.set()

    pump = Pump(events())
    await pump.take()
    pump.close()
    async with asyncio.timeout(5):
        await closed.wait()


def test_frames_are_joined_as_sent_one_by_one() -> None:
    assert frame_bytes(_ev(1, 3)) == b"id: 1-1\r\nevent: custom\r\ndata: xxx\r\n\r\n"
    multiline = StreamEvent("1-2", "custom", b"a\nb")
    assert frame_bytes(multiline) == b"id: 1-2\r\nevent: custom\r\ndata: a\r\ndata: b\r\n\r\n"


def test_a_busy_stream_writes_less_often_and_a_quiet_one_at_once() -> None:
    """`Pace`, on a clock of its own: the first event after a quiet spell is taken at once; while each batch is
    there as soon as it is asked for, the wait between writes doubles from the base to the most; a batch the
    response had to wait for sets it back."""
    pace = Pace(0.002, 0.016, settle=0.0)
    assert pace.pause(100.0) <= 0  # the first event: at once
    pace.wrote(100.0, 100.0001)  # it was there, and still the next wait is the base
    waits = []
    now = 100.0001
    for _ in range(5):  # a busy stream: every batch ready when asked
        wait = pace.pause(now)
        waits.append(round(wait, 6))
        now += wait
        pace.wrote(now, now + 0.0001)
        now += 0.0001
    assert waits == [0.002, 0.004, 0.008, 0.016, 0.016]
    pace.wrote(now + 0.016, now + 0.035)  # waited 19 ms (with no settle: a pause), the base again
    assert round(pace.pause(now + 0.035), 6) == 0.002
    pace.wrote(now + 0.037, now + 0.0375)  # ready within 4 ms (twice the base): busy again
    assert round(pace.pause(now + 0.0375), 6) == 0.004
    assert pace.pause(now + 0.06) <= 0  # and after a quiet spell the next goes out at once


def test_pace_with_no_most_above_the_base_is_a_fixed_wait() -> None:
    pace = Pace(0.002, 0.0)
    for now in (1.0, 1.002, 1.004):
        pace.wrote(now, now)
        assert round(pace.pause(now), 6) == 0.002
    zero = Pace(0.0, 0.016)  # stream_coalesce_ms 0: everything ready at once, always
    zero.wrote(1.0, 1.0)
    assert zero.pause(1.0) <= 0


def test_a_short_busy_stream_keeps_the_base_wait() -> None:
    """Until a stream has been busy for `settle`, its wait stays the base: a short reply's end (its last write)
    is not delayed by a window grown on it."""
    pace = Pace(0.002, 0.016, settle=0.1)
    now = 1.0
    pace.wrote(now, now)
    waits = []
    for _ in range(60):  # 120 ms of batches ready as soon as asked
        wait = pace.pause(now)
        waits.append(round(wait, 6))
        now += wait
        pace.wrote(now, now)
    assert set(waits[:50]) == {0.002}  # the first 100 ms: as before
    assert waits[-1] == 0.016  # busy for longer: the wait has grown to the most
    pace.wrote(now + 0.016, now + 0.036)  # a hiccup (20 ms, under `settle`): halved, still busy
    now += 0.036
    assert round(pace.pause(now), 6) == 0.008
    pace.wrote(now + 0.008, now + 0.008)
    now += 0.008
    assert round(pace.pause(now), 6) == 0.016
    pace.wrote(now + 0.016, now + 0.2)  # a pause of `settle` or more: the stream starts over
    now += 0.2
    pace.wrote(now + 0.002, now + 0.002)
    assert round(pace.pause(now + 0.002), 6) == 0.002
