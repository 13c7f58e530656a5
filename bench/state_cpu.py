#!/usr/bin/env python
"""CPU per request of the large-state requests, in process, on SQLite or PostgreSQL: for A/Bs and profiles.

    python bench/state_cpu.py --kind post                       # POST /threads/{id}/state on the 1 MB thread
    python bench/state_cpu.py --backend pg --kind history       # POST /threads/{id}/history, 200 checkpoints
    python bench/state_cpu.py --kind get --profile /tmp/get.prof
    python bench/state_cpu.py --kind run                        # POST /threads/{id}/runs/wait on the 1 MB thread
    python bench/state_cpu.py --kind talk                       # a turn of a 400-message conversation (1 MB)
    python bench/state_cpu.py --backend pg --kind post --against /tmp/before --rounds 3

The app is `create_app` on `bench/workloads_project` (the `docs` and `ticker` graphs of `bench/workloads.py`)
over a fresh SQLite file or a fresh PostgreSQL database (`--pg-url`, an admin URL; the database is dropped
after), called through ASGI directly: no sockets, no client, no worker process. The thread is set up as
`bench/workloads.py` sets it up (1 MB of values; or 200 checkpoints), 5 requests warm up, then `--requests`
are timed with `time.process_time()` (every thread of the process: SQLite's connection thread counts).
PostgreSQL's own CPU is not counted, as in `bench/workloads.py`. `--against PATH` runs PATH's code (`git
archive <commit> | tar -x -C PATH`) and this checkout in alternating processes, `--rounds` times each.
`--profile` writes a cProfile of the timed requests (the loop's thread only). No timing assertions anywhere.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from cpu import _call
from workload_ops import talk_history

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads_project"


async def call(app: Any, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP request through ASGI: its status and body (bench/cpu.py's, with the method first)."""
    return await _call(app, path, body, method)


async def measure(backend: str, kind: str, requests: int, profile: str | None, pg_url: str) -> float:
    import cProfile

    import orjson
    import psycopg
    from asgi_lifespan import LifespanManager

    from threadline.api.app import create_app
    from threadline.settings import Settings

    dbname = f"threadline_state_cpu_{uuid.uuid4().hex[:8]}" if backend == "pg" else None
    with tempfile.TemporaryDirectory() as tmp:
        if dbname:
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{dbname}"')
            url = pg_url.rsplit("/", 1)[0] + "/" + dbname
        else:
            url = f"sqlite:///{tmp}/bench.db"
        try:
            app = create_app(Settings(config=str(WORKLOADS / "langgraph.json"), database_url=url, log_level="warning"))
            async with LifespanManager(app):
                thread = orjson.loads((await call(app, "POST", "/threads", b"{}"))[1])["thread_id"]
                setup = ({"assistant_id": "ticker", "input": {"count": 0, "target": 200},
                          "config": {"recursion_limit": 250}} if kind == "history" else
                         {"assistant_id": "talk", "input": {"messages": talk_history()}} if kind == "talk" else
                         {"assistant_id": "docs", "input": {"n_docs": 200, "doc_chars": 5000}})
                status, answer = await call(app, "POST", f"/threads/{thread}/runs/wait", orjson.dumps(setup))
                if status != 200:
                    raise SystemExit(f"setup failed: {status} {answer[:200]!r}")

                def request(i: int) -> tuple[str, str, bytes]:
                    if kind == "get":
                        return "GET", f"/threads/{thread}/state", b""
                    if kind == "history":
                        return "POST", f"/threads/{thread}/history", b'{"limit": 200}'
                    if kind == "talk":  # a turn of the conversation: a question, the whole conversation answered
                        return "POST", f"/threads/{thread}/runs/wait", orjson.dumps(
                            {"assistant_id": "talk", "input": {"messages": [{"role": "user", "content": f"q {i}"}]}})
                    if kind == "run":  # a turn on the thread: its node reads the documents, writes a note
                        return "POST", f"/threads/{thread}/runs/wait", orjson.dumps(
                            {"assistant_id": "docs", "input": {"notes": f"run {i}"}})
                    return "POST", f"/threads/{thread}/state", orjson.dumps(
                        {"values": {"notes": f"note {i}"}, "as_node": "load"})

                for i in range(5):
                    await call(app, *request(i))
                # CPU time of the loop's thread, not wall time: on a shared machine a call that lost the CPU
                # would look expensive.
                profiler = cProfile.Profile(time.thread_time) if profile else None
                started = time.process_time()
                for i in range(requests):
                    if profiler is not None:
                        profiler.enable()
                    status, answer = await call(app, *request(i))
                    if profiler is not None:
                        profiler.disable()
                    if status != 200:
                        raise SystemExit(f"request failed: {status} {answer[:200]!r}")
                spent = time.process_time() - started
                if profiler is not None:
                    profiler.dump_stats(profile)
        finally:
            if dbname:
                with psycopg.connect(pg_url, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    return spent / requests * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "pg"], default="sqlite")
    parser.add_argument("--kind", choices=["get", "post", "history", "run", "talk"], default="post")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--profile", help="write a cProfile of the timed requests here")
    parser.add_argument("--pg-url", default=os.environ.get("THREADLINE_BENCH_PG_URL",
                                                           "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--against", help="a checkout of older code, measured in alternating processes")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.against:
        results: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            for name, path in (("old", args.against), ("new", str(HERE.parent))):
                command = [sys.executable, str(HERE / "state_cpu.py"), "--backend", args.backend, "--kind", args.kind,
                           "--requests", str(args.requests), "--pg-url", args.pg_url]
                out = subprocess.run(command, env={**os.environ, "PYTHONPATH": path}, capture_output=True,
                                     text=True, check=True, cwd=path)
                results[name].append(float(out.stdout.split()[-3]))
                print(f"{name}: {results[name][-1]:.2f} ms CPU/request", flush=True)
        old, new = (sum(results[k]) / len(results[k]) for k in ("old", "new"))
        print(f"{args.backend} {args.kind}: old {old:.2f}, new {new:.2f} ms CPU/request (new/old {new / old:.2f})")
        return
    from threadline.cli import run_loop

    spent = run_loop(measure(args.backend, args.kind, args.requests, args.profile, args.pg_url))
    import threadline

    print(f"{args.backend} {args.kind} (threadline from {Path(threadline.__file__).parent}): "
          f"{spent:.2f} ms CPU/request")


if __name__ == "__main__":
    main()
