#!/usr/bin/env python
"""Interleaved A/B of running servers: the same thread-run wait, alternating between them.

    python bench/ab.py 400 8123 8124      # servers already listening on those ports

On a shared VM the machine's speed moves by a millisecond or more from one minute to the next, so two
servers measured one after the other cannot be compared to a fraction of a millisecond. Alternating each
request between them puts the drift on both. Start the two servers on the bench graph first, e.g. one per
checkout (the commit before a change and after it), each on a fresh database:

    cd bench/project && PYTHONPATH=/path/to/checkout THREADLINE_DATABASE_URL=sqlite:////tmp/a.db \\
        python -m threadline serve --port 8123 --log-level warning &

Each round creates a thread on every server, then times `POST /threads/{id}/runs/wait` on each in turn
(and `GET /ok`, the client's own round trip). Prints p50 and p90 per server; the first 20 rounds are
warm-up. Run it twice with the ports swapped. Used for the A/B numbers in the issue notes and in
`docs/architecture.md`; not part of `bench/run.py`.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import aiohttp

BODY = {"assistant_id": "bench", "input": {"messages": [{"role": "user", "content": "hi"}]}}
WARMUP = 20


async def main(rounds: int, ports: list[str]) -> None:
    sessions = [aiohttp.ClientSession(f"http://127.0.0.1:{p}") for p in ports]
    waits: dict[str, list[float]] = {p: [] for p in ports}
    oks: dict[str, list[float]] = {p: [] for p in ports}
    try:
        for _ in range(rounds):
            for port, session in zip(ports, sessions, strict=True):
                async with session.post("/threads", json={}) as r:
                    thread_id = (await r.json())["thread_id"]
                started = time.perf_counter()
                async with session.post(f"/threads/{thread_id}/runs/wait", json=BODY) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"port {port}: HTTP {r.status}")
                waits[port].append(time.perf_counter() - started)
                started = time.perf_counter()
                async with session.get("/ok") as r:
                    await r.read()
                oks[port].append(time.perf_counter() - started)
    finally:
        for session in sessions:
            await session.close()
    for port in ports:
        w = waits[port][WARMUP:]
        print(f"port {port}: wait p50 {statistics.median(w) * 1e3:.2f} ms  "
              f"p90 {statistics.quantiles(w, n=10)[-1] * 1e3:.2f}  "
              f"ok p50 {statistics.median(oks[port][WARMUP:]) * 1e3:.2f}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    asyncio.run(main(int(sys.argv[1]), sys.argv[2:]))
