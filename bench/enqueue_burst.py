#!/usr/bin/env python
"""Run creations per second in a burst, on PostgreSQL, with the queue's quota (`max_active_runs`) set or not.

    python bench/enqueue_burst.py                               # this checkout: quota on, then off
    python bench/enqueue_burst.py --against /tmp/old --pairs 3  # an older checkout and this one, alternating

`--concurrency` enqueues at a time (default 32), each a new run on a new thread (the thread created by the same
transaction, as `if_not_exists: create` does), `--runs` in all, straight through `Storage.enqueue_run` in one
process: no HTTP, no worker (the runs stay pending; the quota's cap is set far above `--runs`, so it is checked
and never refuses). A fresh database `threadline_bench_<token>` per process, dropped at the end (admin URL
`--pg-admin-url`, default `$BENCH_PG_ADMIN_URL` or `postgresql://postgres@127.0.0.1:5432/test`). It prints
creations/s per cell; with `--against`, each pair's ratio new/old. No timing assertion anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _run_row(thread_id: str) -> dict:
    now = datetime.now(UTC).isoformat()
    return {"run_id": str(uuid.uuid4()), "thread_id": thread_id, "assistant_id": str(uuid.uuid4()),
            "status": "pending", "kwargs": {"input": {"n": 1}}, "metadata": {}, "multitask_strategy": "enqueue",
            "available_at": now, "created_at": now, "updated_at": now}


async def _cell(storage, runs: int, concurrency: int, quota) -> float:
    todo = iter(range(runs))

    async def client() -> None:
        for _ in todo:
            await storage.enqueue_run(_run_row(str(uuid.uuid4())), thread_metadata={"graph_id": "g"},
                                      create_thread=True, reject_if_active=False, quota=quota)

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return runs / (time.perf_counter() - started)


async def _measure(admin: str, runs: int, concurrency: int) -> dict[str, float]:
    import psycopg

    from threadline.storage.base import Quota
    from threadline.storage.postgres import PostgresStorage

    name = f"threadline_bench_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + f"/{name}"
    try:
        storage = await PostgresStorage.open(url)
        try:
            await _cell(storage, 64, concurrency, None)  # warm the pool and the statements
            quota = Quota(None, 0, runs * 100)
            return {"quota on": await _cell(storage, runs, concurrency, quota),
                    "quota off": await _cell(storage, runs, concurrency, None)}
        finally:
            await storage.close()
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _in_process(source: str, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": source}
    out = subprocess.run([sys.executable, __file__, "--json", "--runs", str(args.runs), "--concurrency",
                          str(args.concurrency), "--pg-admin-url", args.pg_admin_url],
                         env=env, cwd="/", check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pg-admin-url", default=ADMIN)
    parser.add_argument("--against", help="a checkout of older code, measured in alternating processes")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(asyncio.run(_measure(args.pg_admin_url, args.runs, args.concurrency))))
        return
    if not args.against:
        cells = asyncio.run(_measure(args.pg_admin_url, args.runs, args.concurrency))
        for cell, value in cells.items():
            print(f"{cell}: {value:.0f} creations/s")
        print(f"quota on/off: {cells['quota on'] / cells['quota off']:.2f}")
        return
    ratios: dict[str, list[float]] = {}
    for pair in range(args.pairs):
        old, new = _in_process(args.against, args), _in_process(str(REPO), args)
        for cell in new:
            ratios.setdefault(cell, []).append(new[cell] / old[cell])
            print(f"pair {pair + 1} {cell}: old {old[cell]:.0f}  new {new[cell]:.0f} creations/s  "
                  f"new/old {new[cell] / old[cell]:.2f}")
        # What the quota costs, within one process: the machine's drift falls on both cells alike.
        for side, cells in (("old", old), ("new", new)):
            ratios.setdefault(f"{side} quota on/off", []).append(cells["quota on"] / cells["quota off"])
    for cell, values in ratios.items():
        label = "median" if "on/off" in cell else "median new/old"
        print(f"{cell}: {label} {statistics.median(values):.2f} over {len(values)} pairs")


if __name__ == "__main__":
    main()
