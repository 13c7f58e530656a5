#!/usr/bin/env python
"""CPU per run of the whole app, in-process, against the floor: for changes too small for wall-clock A/Bs.

    python bench/cpu.py                                  # 600 thread-run waits; CPU per run, app and floor
    python bench/cpu.py --kind stream                    # 17-token messages-tuple streams instead
    python bench/cpu.py --against /tmp/old --pairs 3     # old checkout and this one, alternating processes
    python bench/cpu.py --profile /tmp/app.prof          # cProfile of the app's requests only
    python bench/cpu.py --kind long --tokens 4000 --mode messages --runs 10   # long replies (workloads' `chat`)
    python bench/cpu.py --kind long --model async --runs 20   # the same reply from a natively async model
    python bench/cpu.py --kind protocol --runs 8              # the same reply as a protocol run (/commands)
    python bench/cpu.py --kind agent --runs 20                # a 25-step tool-calling agent on a thread
    python bench/cpu.py --kind long --runs 6 --pg --set 'redis_url="redis://127.0.0.1:6379/0"'   # scale-out

The app is `create_app` on the bench graph (`bench/project`) over a fresh SQLite file (or, with `--pg`, a fresh
PostgreSQL database made through `--pg-url`, dropped after; `--set redis_url=...` adds Redis), called through ASGI
directly: no sockets, no client; in one process, so the API's and the worker's CPU are summed, and PostgreSQL's
and Redis's own are not counted. After each request the floor (the graph in-process, `InMemorySaver`) runs
once, and both are timed with `time.process_time()` (every thread of the process, so aiosqlite's and
LangGraph's executor threads count). The printed ratio, app CPU over floor CPU, carries the machine's speed
on both sides, which on a shared VM moves by 2-3x from one minute to the next; compare ratios, not
milliseconds. `--against PATH` runs PATH's code (a checkout, e.g. `git archive <commit> | tar -x -C PATH`)
and this one in alternating processes, `--pairs` times. A change of about 0.1 ms per run shows; smaller
ones need more runs or pairs. `--kind long` streams `bench/workloads_project`'s `chat` graph (a reply of
`--tokens` chunks) in `--mode` (`messages-tuple`, `messages`, `values`, `updates`), read whole, against the
same graph's `astream(stream_mode="messages")` in process: the per-token cost of the server's stream path
without sockets (`bench/workloads.py` measures it over HTTP). `--kind protocol` starts that reply as a protocol
run (`run.start` on a new thread through `/threads/{id}/commands`; timed until its join returns, so the events
written into the thread's log count) against LangGraph's own stream of the protocol's modes
(`astream(version="v2")` with the protocol's stream modes, its messages as content-block events, and
`InMemorySaver`). `--kind agent` runs workloads' 25-step `agent` (a model node and a tool node, a checkpoint
per step, 50 messages at the end) on a new thread, streamed in `messages-tuple` + `updates` and read whole,
against the same graph's `astream` of `messages` + `updates` with `InMemorySaver`: the per-step cost of a
thread run (checkpoint writes included; `bench/workloads.py` measures it served). Each line also gives the median of the
per-request ratios (each request against the floor run right after it: steadier than the sums when the
machine's load moves) and the body messages the app sent per run (each is a pass through the middleware and,
served, a socket write). `--set NAME=VALUE` gives the app a setting (`stream_coalesce_ms=0`), on both sides of
`--against`. The app freezes its startup heap itself while it serves (`threadline.heap`), as a served process does.
No timing assertions anywhere: a measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROJECT = HERE / "project"
WORKLOADS = HERE / "workloads_project"
INPUT = {"messages": [{"role": "user", "content": "hi"}]}
SENDS = [0]  # body messages the app sent (each is a pass through the middleware and a socket write when served)


async def _call(app: Any, path: str, body: bytes, method: str = "POST") -> tuple[int, bytes]:
    """One HTTP request through ASGI; its status and body. The client "disconnects" once the body is sent."""
    received = False
    done = asyncio.Event()
    status, chunks = 0, []

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            SENDS[0] += 1
            if not message.get("more_body"):
                done.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    return status, b"".join(chunks)


async def measure(runs: int, kind: str, profile: str | None, tokens: int = 4000,
                  mode: str = "messages-tuple", settings: dict[str, Any] | None = None,
                  model: str = "sync", pg_url: str | None = None) -> dict[str, float]:
    import cProfile

    import orjson
    import psycopg
    from asgi_lifespan import LifespanManager
    from langgraph.checkpoint.memory import InMemorySaver

    from threadline.api.app import create_app
    from threadline.settings import Settings

    project = WORKLOADS if kind in ("long", "protocol", "agent") else PROJECT
    sys.path.insert(0, str(project))  # the graph, imported as the benches import it for their floor
    if kind == "protocol":
        from graphs import chat  # type: ignore[import-not-found]

        from threadline.core.protocol_events import CONFIG_KEY_STREAM_MESSAGES_V2, PROTOCOL_STREAM_MODES

        floor = chat.copy(update={"checkpointer": InMemorySaver()})
        floor_config = {"configurable": {"reply_tokens": tokens, "chat_model": model,
                                         CONFIG_KEY_STREAM_MESSAGES_V2: True}}
        body = {"id": 1, "method": "run.start",
                "params": {"assistant_id": "chat", "input": INPUT, "config": {"configurable": {
                    "reply_tokens": tokens, "chat_model": model}}}}
    elif kind == "agent":
        from graphs import agent

        floor = agent.copy(update={"checkpointer": InMemorySaver()})
        floor_config = {"recursion_limit": 200, "configurable": {"agent_steps": 25}}
        body = {"assistant_id": "agent", "input": INPUT, "stream_mode": ["messages-tuple", "updates"],
                "config": floor_config}
    elif kind == "long":
        from graphs import chat as floor
        floor_config: dict[str, Any] = {"configurable": {"reply_tokens": tokens, "chat_model": model}}
        body = {"assistant_id": "chat", "input": INPUT, "stream_mode": [mode], "config": floor_config}
    else:
        from graph import build

        floor = build().compile(checkpointer=InMemorySaver())
        floor_config = {}
        body = {"assistant_id": "bench", "input": INPUT}
        if kind == "stream":
            body["stream_mode"] = ["messages-tuple"]
    request = orjson.dumps(body)
    dbname = f"threadline_cpu_{uuid.uuid4().hex[:8]}" if pg_url else None
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as cleanup:
        database_url = f"sqlite:///{tmp}/bench.db"
        if pg_url and dbname:
            with psycopg.connect(pg_url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{dbname}"')
            cleanup.callback(_drop_database, pg_url, dbname)
            database_url = pg_url.rsplit("/", 1)[0] + "/" + dbname
        app = create_app(Settings(config=str(project / "langgraph.json"), database_url=database_url,
                                  **(settings or {}),
                                  log_level="warning"))
        async with LifespanManager(app):
            threads = []
            if kind in ("thread", "agent"):
                for _ in range(runs + 20):
                    threads.append(orjson.loads((await _call(app, "/threads", b"{}"))[1])["thread_id"])
            path = {"thread": None, "stateless": "/runs/wait", "stream": "/runs/stream", "long": "/runs/stream",
                    "protocol": None, "agent": None}[kind]
            profiler = cProfile.Profile() if profile else None
            app_cpu = floor_cpu = 0.0
            ratios = []  # each request's app CPU over the floor run right after it: robust to a loaded minute
            warmup = 2 if kind in ("long", "protocol", "agent") else 20
            for i in range(runs + warmup):  # the first ones warm up
                timed = i >= warmup
                started = time.process_time()
                if profiler is not None and timed:
                    profiler.enable()
                if kind == "protocol":
                    status, answer = await _protocol_run(app, request)
                else:
                    status, answer = await _call(app, path or f"/threads/{threads[i]}/runs/"
                                                 f"{'stream' if kind == 'agent' else 'wait'}", request)
                if profiler is not None and timed:
                    profiler.disable()
                between = time.process_time()
                if status != 200 or (kind == "stream" and b"event: messages" not in answer) or (
                        kind in ("long", "agent") and b"event: error" in answer) or (
                        kind == "agent" and answer.count(b"event: updates") != 49) or (
                        kind == "protocol" and json.loads(answer)["status"] != "idle"):
                    raise SystemExit(f"request failed: {status} {answer[:200]!r}")
                config = {**floor_config,
                          "configurable": {"thread_id": str(uuid.uuid4()), **floor_config.get("configurable", {})}}
                if kind == "protocol":
                    async for _ in floor.astream(INPUT, config, version="v2", stream_mode=PROTOCOL_STREAM_MODES,
                                                 subgraphs=True):
                        pass
                elif kind == "agent":
                    async for _ in floor.astream(INPUT, config, stream_mode=["messages", "updates"]):
                        pass
                elif kind in ("stream", "long"):
                    async for _ in floor.astream(INPUT, config, stream_mode="messages"):
                        pass
                else:
                    await floor.ainvoke(INPUT, config)
                if i == warmup - 1:
                    SENDS[0] = 0
                if timed:
                    app_cpu += between - started
                    floor_cpu += time.process_time() - between
                    ratios.append((between - started) / max(time.process_time() - between, 1e-9))
            if profiler is not None:
                profiler.dump_stats(profile)
    return {"app_ms": app_cpu / runs * 1000, "floor_ms": floor_cpu / runs * 1000, "ratio": app_cpu / floor_cpu,
            "median": statistics.median(ratios), "sends": SENDS[0] / runs}


def _drop_database(pg_url: str, dbname: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


async def _protocol_run(app: Any, request: bytes) -> tuple[int, bytes]:
    """A protocol run on a new thread, from its `run.start` until it has ended (joined: no polling; its events
    are in the thread's log by then, written before the run's end); the join's status, and the thread."""
    thread_id = str(uuid.uuid4())
    status, answer = await _call(app, f"/threads/{thread_id}/commands", request)
    if status != 200:
        return status, answer
    run_id = json.loads(answer)["result"]["run_id"]
    joined, _ = await _call(app, f"/threads/{thread_id}/runs/{run_id}/join", b"", "GET")
    return (joined, (await _call(app, f"/threads/{thread_id}", b"", "GET"))[1]) if joined == 200 else (joined, b"")


def _against(old: str, runs: int, kind: str, pairs: int, extra: list[str]) -> None:
    results: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for _ in range(pairs):
        for name, path in (("old", old), ("new", str(HERE.parent))):
            env = {**os.environ, "PYTHONPATH": path}
            command = [sys.executable, str(HERE / "cpu.py"), "--runs", str(runs), "--kind", kind, "--json", *extra]
            out = subprocess.run(command,
                                 env=env, capture_output=True, text=True, check=True, cwd=path)
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{name}: {_line(results[name][-1])}", flush=True)
    for name in ("old", "new"):
        print(f"{name} ratio mean {statistics.mean(r['ratio'] for r in results[name]):.3f}  median of the "
              f"per-request ratios, mean {statistics.mean(r['median'] for r in results[name]):.3f}")


def _line(r: dict[str, float]) -> str:
    return (f"ratio {r['ratio']:.3f} (per-request median {r['median']:.3f})  app {r['app_ms']:.3f} ms/run  "
            f"floor {r['floor_ms']:.3f} ms/run  {r.get('sends', 0):.0f} sends/run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--kind", choices=["thread", "stateless", "stream", "long", "protocol", "agent"],
                        default="thread")
    parser.add_argument("--tokens", type=int, default=4000, help="--kind long: the reply's chunks")
    parser.add_argument("--mode", default="messages-tuple", help="--kind long: the stream mode")
    parser.add_argument("--model", choices=["sync", "async"], default="sync",
                        help="--kind long: the chat model streams from a thread per chunk (GenericFakeChatModel's "
                             "synchronous `_stream`) or from its own `_astream`, as provider clients do")
    parser.add_argument("--against", help="a checkout of older code, measured in alternating processes")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--profile", help="write a cProfile of the app's timed requests here")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the app (e.g. stream_coalesce_ms=0), for both sides of --against")
    parser.add_argument("--pg", action="store_true", help="a fresh PostgreSQL database instead of SQLite")
    parser.add_argument("--pg-url", default=os.environ.get("THREADLINE_BENCH_PG_URL",
                                                           "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="--pg: an admin URL, where the fresh database is made and dropped")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.against:
        extra = ["--tokens", str(args.tokens), "--mode", args.mode, "--model", args.model,
                 *(["--pg", "--pg-url", args.pg_url] if args.pg else []), *(f"--set={s}" for s in args.set)]
        _against(args.against, args.runs, args.kind, args.pairs, extra)
        return
    from threadline.cli import run_loop  # the loop `threadline serve` runs on

    settings = {name: json.loads(value) for name, _, value in (s.partition("=") for s in args.set)}
    result = run_loop(measure(args.runs, args.kind, args.profile, args.tokens, args.mode, settings, args.model,
                              args.pg_url if args.pg else None))
    print(json.dumps(result) if args.json else _line(result))


if __name__ == "__main__":
    main()
