"""`finish_run` on PostgreSQL alone: CPU and wall per call (issues 28 and 24).

N runs are enqueued (each on a thread of its own) and claimed, then each is finished as a worker finishes it
(fenced by worker and attempt, with an output and the thread's values). Prints the CPU (`time.process_time`)
and wall per call of the finishes only, and the CPU the database's own server processes spent meanwhile (from
/proc: run it on the database's machine). For round trips, run it under `strace -f -e trace=sendto,recvfrom,write`:
the finishes lie between the `MARK-START` and `MARK-END` writes on stderr.

    python bench/finish_run.py [--runs 200] [--url postgresql://postgres@127.0.0.1:5432/postgres]
    python bench/finish_run.py --runs 40 --state-kb 1000     # a thread run on a 1 MB state: output = values
    PYTHONPATH=<other checkout> python bench/finish_run.py --runs 40 --state-kb 1000   # that tree's code

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
from procstat import cpu_seconds

from threadline.storage import open_storage

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "the", "model", "thinks"]


def state_of(kb: int) -> dict[str, Any]:
    """About `kb` KB of JSON shaped as `bench/workloads.py`'s large state (documents of 5,000 characters)."""
    if kb <= 0:
        return {"n": 1}
    text = ((" ".join(WORDS) + " ") * 72)[:5000]
    return {"documents": [{"id": i, "title": f"document {i}", "text": text} for i in range(max(1, kb // 5))],
            "notes": ""}


async def main(runs: int, url: str, state_kb: int) -> None:
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
        with psycopg.connect(url.rsplit("/", 1)[0] + "/" + name, autocommit=True) as watch:
            backends = [row[0] for row in watch.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        state = state_of(state_kb)
        os.write(2, b"MARK-START\n")
        wall, cpu, db_cpu = time.perf_counter(), time.process_time(), cpu_seconds(backends)
        for run in claimed:
            done = await storage.finish_run(run["run_id"], "success", worker_id="w1", attempt=run["attempt"],
                                            output=state, thread_changes={"values": state})
            assert done is not None and done["status"] == "success"
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        db_cpu = cpu_seconds(backends) - db_cpu
        os.write(2, b"MARK-END\n")
        print(f"finish_run x{len(claimed)}: wall {1000 * wall / len(claimed):.3f} ms, "
              f"CPU {1000 * cpu / len(claimed):.3f} ms per call, PostgreSQL's "
              f"{1000 * db_cpu / len(claimed):.3f} ms")
    finally:
        await storage.close()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--state-kb", type=int, default=0,
                        help="the output and the thread's values: about this many KB of documents (0: {\"n\": 1})")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.url, args.state_kb))
