"""`finish_run` on PostgreSQL alone: CPU and wall per call (issue 28).

N runs are enqueued (each on a thread of its own) and claimed, then each is finished as a worker finishes it
(fenced by worker and attempt, with an output and the thread's values). Prints the CPU (`time.process_time`)
and wall per call of the finishes only. For round trips, run it under `strace -f -e trace=sendto,recvfrom,write`:
the finishes lie between the `MARK-START` and `MARK-END` writes on stderr.

    python bench/finish_run.py [--runs 200] [--url postgresql://postgres@127.0.0.1:5432/postgres]

It creates a database of its own (`bench_finish_run_<pid>`) and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg

from threadline.storage import open_storage


async def main(runs: int, url: str) -> None:
    name = f"bench_finish_run_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    storage = await open_storage(url.rsplit("/", 1)[0] + "/" + name)
    try:
        for _ in range(runs):
            now = datetime.now(UTC).isoformat()
            run: Any = {"run_id": str(uuid.uuid4()), "thread_id": str(uuid.uuid4()), "assistant_id": "agent",
                        "status": "pending", "metadata": {}, "kwargs": {}, "multitask_strategy": "enqueue",
                        "available_at": now, "created_at": now, "updated_at": now}
            await storage.enqueue_run(run, thread_metadata={}, create_thread=True, reject_if_active=False)
        claimed = await storage.claim_runs("w1", 300, limit=runs)
        os.write(2, b"MARK-START\n")
        wall, cpu = time.perf_counter(), time.process_time()
        for run in claimed:
            done = await storage.finish_run(run["run_id"], "success", worker_id="w1", attempt=run["attempt"],
                                            output={"n": 1}, thread_changes={"values": {"n": 1}})
            assert done is not None and done["status"] == "success"
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        os.write(2, b"MARK-END\n")
        print(f"finish_run x{len(claimed)}: wall {1000 * wall / len(claimed):.3f} ms, "
              f"CPU {1000 * cpu / len(claimed):.3f} ms per call")
    finally:
        await storage.close()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.url))
