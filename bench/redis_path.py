#!/usr/bin/env python
"""CPU per event of the Redis stream path alone, in one process: a run's events posted as an executor posts
them (`RedisBroker.post`, a few per loop tick, each the size of a held `messages-tuple` delta) and read back
by a subscriber (`subscribe_batches`), as an API process reads them for a stream's response.

    python bench/redis_path.py                 # 8,000 events x 4 rounds; prints CPU microseconds per event
    python bench/redis_path.py 4000 --rounds 6
    THREADLINE_BENCH_REDIS=redis://127.0.0.1:6379/0

Both halves of a token's trip through Redis (the worker's pipeline, the API's `XREAD`) run in this process, so
`time.process_time()` counts them without the graph, HTTP or a second process: steadier on a loaded machine
than `bench/workloads.py`'s cells, whose server CPU moves by about 25% between runs of the same code. The line
says whether redis-py parses with hiredis. Keys are under a fresh prefix, deleted afterwards. No assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid

import redis.asyncio as aioredis
import redis.utils

from threadline.broker.redis import RedisBroker
from threadline.cli import run_loop

REDIS = os.environ.get("THREADLINE_BENCH_REDIS", "redis://127.0.0.1:6379/0")
#: A held `messages-tuple` delta: its header line and a word (core/partials.py).
DATA = b"\x00[0,12,640,80]\n" + b"word " * 4


async def one_round(broker: RedisBroker, events: int) -> float:
    run, got = uuid.uuid4().hex, 0

    async def read() -> None:
        nonlocal got
        async for batch in broker.subscribe_batches(run, replay=True):
            got += len(batch)

    began = time.process_time()
    reader = asyncio.create_task(read())
    for i in range(events):
        await broker.post(run, "messages", DATA)
        if i % 4 == 0:
            await asyncio.sleep(0)  # a few events per loop tick, as a model's tokens come
    await broker.end_stream(run)
    await reader
    if got != events:
        raise RuntimeError(f"read {got} of {events} events")
    return (time.process_time() - began) / events * 1e6


async def main(events: int, rounds: int) -> dict[str, object]:
    prefix = f"tlbench-path-{uuid.uuid4().hex[:10]}"
    broker = RedisBroker(REDIS, key_prefix=prefix)
    await broker.start()
    try:
        times = [await one_round(broker, events) for _ in range(rounds)]
    finally:
        await broker.close()
        client = aioredis.from_url(REDIS)
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
    return {"hiredis": redis.utils.HIREDIS_AVAILABLE, "events": events,
            "cpu_us_per_event_median": round(statistics.median(times), 2), "rounds": [round(t, 2) for t in times]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("events", type=int, nargs="?", default=8000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(run_loop(main(args.events, args.rounds))))
