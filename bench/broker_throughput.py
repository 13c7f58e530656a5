#!/usr/bin/env python
"""Events per second through each shared broker: one process posts a run's events, another receives them.

    python bench/broker_throughput.py [events] [bytes per event] [rounds] [runs]
    THREADLINE_BENCH_PG=postgresql://postgres@127.0.0.1:5432/test THREADLINE_BENCH_REDIS=redis://127.0.0.1:6379/0

Per round and broker, a subscriber process follows `runs` runs (from the start), then this process posts
`events` events of `bytes` bytes in all, spread over the runs posting at once, as runs' executors do
(`post`, not waiting for each), and ends the streams. Keep events x (bytes + 160) under
`stream_buffer_bytes` (8 MiB) per run, or a lagging subscriber misses trimmed events (counted, reported).
Reported: publish (posts until `end_stream` returned) and delivery (first post until the other
process received the last event), in events/s, median of the rounds, and PostgreSQL as a ratio of Redis
measured in the same run (brokers alternate per round, so the machine's drift falls on both). Tables and
keys are under a fresh prefix, dropped afterwards. Not part of `bench/run.py`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import sys
import time
import uuid

PG = os.environ.get("THREADLINE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("THREADLINE_BENCH_REDIS", "redis://127.0.0.1:6379/0")


def _open(kind: str, prefix: str):  # type: ignore[no-untyped-def]
    from threadline.broker import open_broker

    return open_broker(PG if kind == "postgres" else REDIS, key_prefix=prefix)


def _subscriber(kind: str, prefix: str, run_ids: list[str], ready: multiprocessing.Queue,
                out: multiprocessing.Queue) -> None:
    async def follow(broker, run_id: str) -> int:  # type: ignore[no-untyped-def]
        return sum([1 async for _ in broker.subscribe(run_id, replay=True)])

    async def main() -> None:
        broker = _open(kind, prefix)
        await broker.start()
        ready.put(True)
        counts = await asyncio.gather(*(follow(broker, run_id) for run_id in run_ids))
        out.put((sum(counts), time.time()))
        await broker.close()

    asyncio.run(main())


async def _round(kind: str, prefix: str, events: int, size: int, runs: int) -> tuple[float, float]:
    run_ids = [uuid.uuid4().hex for _ in range(runs)]
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_subscriber, args=(kind, prefix, run_ids, ready, out))
    proc.start()
    broker = _open(kind, prefix)
    await broker.start()
    await asyncio.to_thread(ready.get, True, 60)
    payload = b'{"chunk": "' + b"x" * max(0, size - 13) + b'"}'

    async def run(run_id: str) -> None:
        for _ in range(events // runs):
            await broker.post(run_id, "messages", payload)
            await asyncio.sleep(0)  # an executor yields between chunks
        await broker.end_stream(run_id)

    began = time.time()
    await asyncio.gather(*(run(run_id) for run_id in run_ids))
    published = time.time() - began
    count, last = await asyncio.to_thread(out.get, True, 300)
    proc.join(30)
    await broker.close()
    sent = events // runs * runs
    if count != sent:
        print(f"  ({kind}: the subscriber received {count} of {sent}: the rest was trimmed before it read it)")
    return sent / published, count / (last - began)


async def _cleanup(prefix: str) -> None:
    import psycopg
    import redis.asyncio as aioredis

    from threadline.broker.pgsql import PgNames

    names = PgNames(prefix)
    async with await psycopg.AsyncConnection.connect(PG, autocommit=True) as conn:
        await conn.execute(f"DROP TABLE IF EXISTS {names.streams}, {names.events}, {names.cancels}")  # type: ignore[arg-type]
    client = aioredis.Redis.from_url(REDIS)
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def main(events: int, size: int, rounds: int, runs: int) -> None:
    prefix = f"bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    results: dict[str, list[tuple[float, float]]] = {"redis": [], "postgres": []}
    try:
        for _ in range(rounds):
            for kind in results:
                results[kind].append(await _round(kind, prefix, events, size, runs))
    finally:
        await _cleanup(prefix)
    print(f"{events} events of {size} bytes over {runs} runs at once, {rounds} rounds (median events/s)")
    medians = {k: (statistics.median(p for p, _ in v), statistics.median(d for _, d in v)) for k, v in results.items()}
    for kind, (pub, dlv) in medians.items():
        print(f"  {kind:9} publish {pub:9.0f}/s   delivered to another process {dlv:9.0f}/s")
    r, p = medians["redis"], medians["postgres"]
    print(f"  postgres/redis: publish {p[0] / r[0]:.2f}, delivery {p[1] / r[1]:.2f}")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [20_000, 200, 3, 1][len(args):])))
