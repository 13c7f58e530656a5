#!/usr/bin/env python
"""Run creations per second in a burst, on PostgreSQL, with the queue's quota (`max_active_runs`) set or not,
and what a run's end costs the server with no cap.

    python bench/enqueue_burst.py                               # this checkout
    python bench/enqueue_burst.py --against /tmp/old --pairs 3  # an older checkout and this one, alternating

`--concurrency` enqueues at a time (default 32), each a new run on a new thread (the thread created by the same
transaction, as `if_not_exists: create` does), `--runs` in all, straight through `Storage.enqueue_run` in one
process: no HTTP, no worker (the runs stay pending; the quota's cap is set far above `--runs`, so it is checked
and never refuses). Then the "end" cell: the uncapped cell's runs end (`finish_run`, as a worker ends one),
`--concurrency` at a time. Each cell reports its rate, the bench process's CPU per run (`client_us`) and the
CPU of the database's server processes serving it (`server_us`, from /proc: `bench/procstat.py`), which the
machine's other load does not inflate as it does the rate; the end cell also counts the calls of the slots'
release trigger per run end (`release_calls`, `track_functions`). A fresh database `threadline_bench_<token>`
per process, dropped at the end (admin URL `--pg-admin-url`, default `$BENCH_PG_ADMIN_URL` or
`postgresql://postgres@127.0.0.1:5432/test`). With `--against`, each pair's ratio new/old; `--json-out` writes
every pair. No timing assertion anywhere.
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
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/test")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstat import cpu_seconds  # noqa: E402


def _run_row(thread_id: str) -> dict:
    now = datetime.now(UTC).isoformat()
    return {"run_id": str(uuid.uuid4()), "thread_id": thread_id, "assistant_id": str(uuid.uuid4()),
            "status": "pending", "kwargs": {"input": {"n": 1}}, "metadata": {}, "multitask_strategy": "enqueue",
            "available_at": now, "created_at": now, "updated_at": now}


async def _timed(items: list[Any], concurrency: int, one: Callable[[Any], Awaitable[None]],
                 server: Callable[[], float]) -> dict[str, float]:
    todo = iter(items)

    async def client() -> None:
        for item in todo:
            await one(item)

    cpu, db, started = time.process_time(), server(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    n = len(items)
    return {"per_s": n / wall, "client_us": (time.process_time() - cpu) / n * 1e6,
            "server_us": (server() - db) / n * 1e6}


async def _measure(admin: str, runs: int, concurrency: int) -> dict[str, dict[str, float]]:
    import psycopg

    from threadline.storage.base import Quota
    from threadline.storage.postgres import PostgresStorage

    name = f"threadline_bench_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
        await conn.execute(f"ALTER DATABASE \"{name}\" SET track_functions = 'pl'")
    url = admin.rsplit("/", 1)[0] + f"/{name}"
    try:
        storage = await PostgresStorage.open(url)
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watch:
                async def backends() -> list[int]:
                    cur = await watch.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s "
                                              "AND pid <> pg_backend_pid()", (name,))
                    return [row[0] for row in await cur.fetchall()]

                async def release_calls() -> int:
                    await asyncio.sleep(1.2)  # backends flush their function counts at most once a second
                    await watch.execute("SELECT pg_stat_clear_snapshot()")
                    cur = await watch.execute("SELECT COALESCE(SUM(calls), 0) FROM pg_stat_user_functions "
                                              "WHERE funcname = 'threadline_release_quota_slots'")
                    found = await cur.fetchone()
                    return int(found[0]) if found else 0

                async def enqueue(quota: Any, made: list[str]) -> Callable[[Any], Awaitable[None]]:
                    async def one(_: Any) -> None:
                        row = _run_row(str(uuid.uuid4()))
                        await storage.enqueue_run(row, thread_metadata={"graph_id": "g"}, create_thread=True,
                                                  reject_if_active=False, quota=quota)
                        made.append(row["run_id"])
                    return one

                async def end(run_id: str) -> None:
                    await storage.finish_run(run_id, "success", thread_changes={"status": "idle"})

                warm: list[str] = []
                await _timed(list(range(64)), concurrency, await enqueue(None, warm), lambda: 0.0)
                pids = await backends()  # the pool's connections, all open once warm

                def server() -> float:
                    return cpu_seconds(pids)

                capped: list[str] = []
                uncapped: list[str] = []
                cells = {"quota on": await _timed(list(range(runs)), concurrency,
                                                  await enqueue(Quota(None, 0, runs * 100), capped), server),
                         "quota off": await _timed(list(range(runs)), concurrency, await enqueue(None, uncapped),
                                                   server)}
                before = await release_calls()
                cells["end (no cap)"] = await _timed(uncapped, concurrency, end, server)
                cells["end (no cap)"]["release_calls"] = (await release_calls() - before) / len(uncapped)
                return cells
        finally:
            await storage.close()
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _in_process(source: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": source}
    out = subprocess.run([sys.executable, __file__, "--json", "--runs", str(args.runs), "--concurrency",
                          str(args.concurrency), "--pg-admin-url", args.pg_admin_url],
                         env=env, cwd="/", check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _line(cells: dict[str, dict[str, float]]) -> str:
    return "  ".join(f"{cell}: {v['per_s']:.0f}/s client {v['client_us']:.0f} us server {v['server_us']:.0f} us"
                     + (f" release calls {v['release_calls']:.2f}" if "release_calls" in v else "")
                     for cell, v in cells.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pg-admin-url", default=ADMIN)
    parser.add_argument("--against", help="a checkout of older code, measured in alternating processes")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json-out", help="write every pair's cells here (with --against)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(asyncio.run(_measure(args.pg_admin_url, args.runs, args.concurrency))))
        return
    if not args.against:
        print(_line(asyncio.run(_measure(args.pg_admin_url, args.runs, args.concurrency))))
        return
    pairs = []
    ratios: dict[str, list[float]] = {}
    for pair in range(args.pairs):
        old, new = _in_process(args.against, args), _in_process(str(REPO), args)
        pairs.append({"old": old, "new": new})
        print(f"pair {pair + 1} old: {_line(old)}\npair {pair + 1} new: {_line(new)}")
        for cell in new:
            for key in ("per_s", "client_us", "server_us"):
                ratios.setdefault(f"{cell} {key} new/old", []).append(new[cell][key] / old[cell][key])
        for side, cells in (("old", old), ("new", new)):
            ratios.setdefault(f"{side} quota on/off per_s", []).append(
                cells["quota on"]["per_s"] / cells["quota off"]["per_s"])
    medians = {label: statistics.median(values) for label, values in ratios.items()}
    for side in ("old", "new"):
        for cell in pairs[0][side]:
            for key in ("per_s", "client_us", "server_us", "release_calls"):
                if key in pairs[0][side][cell]:
                    medians[f"{side} {cell} {key}"] = statistics.median(p[side][cell][key] for p in pairs)
    for label, value in medians.items():
        print(f"median {label}: {value:.2f} over {len(pairs)} pairs")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"},
                                                   "pairs": pairs, "medians": medians}, indent=1) + "\n")


if __name__ == "__main__":
    main()
