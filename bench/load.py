"""Load and fault test: many clients past what the server can serve, with and without limits (issue 16).

    python bench/load.py                      # both stacks, limits on then off, ~20 s of load each
    python bench/load.py --stack embedded --seconds 10 --clients 200

For each stack (`embedded`: one `threadline serve` on SQLite; `scaleout`: 2 API + 2 worker processes on
PostgreSQL + Redis) and each mode (`limits`: rate limits, quotas, stream caps and run timeouts on; `none`: the
defaults), `--procs` client processes (several: one Python client saturates a core long before the server
does) each run `--clients / --procs` closed-loop clients for `--seconds`, no think time, mixing: background
run creation, `/runs/wait`, streams read to the end, streams read slowly, streams left after the first event,
thread reads and store reads. Each client process presents its own address in `X-Forwarded-For` (the server
trusts 127.0.0.1 as a proxy in this test), so budgets are per client process. A probe process of its own
samples `GET /ok` and a thread read every 100 ms with a 1 s timeout (a liveness probe's), so the load clients'
own stalls are not counted. The server processes' RSS is sampled every second.

After the load stops, the queue is drained (bounded) and the database says: every run a client was told was
created exists and ended (none lost), and none ran more than once (`attempt`). Results go to
`bench/results/load-<stack>.json`. Bounded in time and count, loopback only, and it stops by itself; no
timing is asserted: this is a measuring tool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import resource
import sqlite3
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

ROOT = harness.REPO_ROOT
BODY = {"assistant_id": "bench", "input": {"messages": [{"role": "user", "content": "hi"}]}}
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
LIMITS = {"THREADLINE_RATE_LIMIT_RUNS": "40/second", "THREADLINE_RATE_LIMIT_REQUESTS": "400/second",
          "THREADLINE_MAX_ACTIVE_RUNS": "300", "THREADLINE_MAX_ACTIVE_RUNS_PER_IDENTITY": "100",
          "THREADLINE_MAX_STREAMS_PER_IDENTITY": "20", "THREADLINE_RUN_TIMEOUT_SECONDS": "60",
          "THREADLINE_STREAM_SEND_TIMEOUT_SECONDS": "2"}
ACTIONS = (("create", 20), ("wait", 15), ("stream", 10), ("slow_stream", 3), ("drop_stream", 5),
           ("thread_read", 30), ("store_read", 17))


# --- the load client (one process) -------------------------------------------------------------------

async def _client(session: aiohttp.ClientSession, tid: str, until: float, out: dict[str, Any]) -> None:
    names = [a for a, _ in ACTIONS]
    weights = [w for _, w in ACTIONS]
    rng = random.Random()
    while time.monotonic() < until:
        action = rng.choices(names, weights)[0]
        try:
            status = await _act(session, action, tid, out)
        except (TimeoutError, aiohttp.ClientError) as exc:
            status = type(exc).__name__
        out["status"][f"{action} {status}"] += 1


async def _act(session: aiohttp.ClientSession, action: str, tid: str, out: dict[str, Any]) -> int:
    if action == "create":
        async with session.post(f"/threads/{tid}/runs", json=BODY) as r:
            if r.status == 200:
                out["runs"].append((await r.json())["run_id"])
            return r.status
    if action == "wait":
        async with session.post(f"/threads/{tid}/runs/wait", json=BODY) as r:
            await r.read()
            _created(r, out)
            return r.status
    if action in ("stream", "slow_stream", "drop_stream"):
        body = {**BODY, "stream_mode": ["messages-tuple", "values"]}
        async with session.post(f"/threads/{tid}/runs/stream", json=body) as r:
            _created(r, out)
            if r.status != 200:
                await r.read()
                return r.status
            if action == "drop_stream":
                await r.content.readany()  # the first bytes, then gone mid-stream
                r.close()
                return r.status
            async for _ in r.content.iter_chunked(256 if action == "slow_stream" else 65536):
                if action == "slow_stream":
                    await asyncio.sleep(0.2)
            return r.status
    if action == "thread_read":
        async with session.get(f"/threads/{tid}") as r:
            await r.read()
            return r.status
    async with session.get("/store/items", params={"namespace": "bench", "key": "k"}) as r:
        await r.read()
        return r.status


def _created(r: aiohttp.ClientResponse, out: dict[str, Any]) -> None:
    where = r.headers.get("Content-Location", "")
    if r.status == 200 and "/runs/" in where:
        out["runs"].append(where.rsplit("/", 1)[1])


async def _load(base: str, clients: int, seconds: float, address: str) -> dict[str, Any]:
    out: dict[str, Any] = {"status": Counter(), "runs": []}
    headers = {"X-Forwarded-For": address}
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=clients + 10)
    async with aiohttp.ClientSession(base, headers=headers, timeout=timeout, connector=connector) as session:
        tids = []
        for _ in range(clients):
            async with session.post("/threads", json={}) as r:
                tids.append((await r.json())["thread_id"])
        until = time.monotonic() + seconds
        await asyncio.gather(*(_client(session, tid, until, out) for tid in tids))
    return out


def load_process(base: str, clients: int, seconds: float, address: str, results: Any) -> None:
    started = time.process_time()
    out = asyncio.run(_load(base, clients, seconds, address))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    results.put({"status": dict(out["status"]), "runs": out["runs"], "cpu_s": usage.ru_utime + usage.ru_stime,
                 "cpu_s_in_load": time.process_time() - started})


# --- the probe (its own process) ---------------------------------------------------------------------

async def _probe(base: str, seconds: float) -> dict[str, Any]:
    lat: dict[str, list[float]] = {"ok": [], "thread_read": []}
    failures: Counter[str] = Counter()
    timeout = aiohttp.ClientTimeout(total=1.0)  # a liveness probe's
    async with aiohttp.ClientSession(base, timeout=timeout, headers={"X-Forwarded-For": "10.9.9.9"}) as s:
        async with s.post("/threads", json={}) as r:
            tid = (await r.json())["thread_id"]
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for name, path in (("ok", "/ok"), ("thread_read", f"/threads/{tid}")):
                t0 = time.perf_counter()
                try:
                    async with s.get(path) as r:
                        await r.read()
                        if r.status != 200:
                            failures[f"{name} {r.status}"] += 1
                        else:
                            lat[name].append(time.perf_counter() - t0)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    failures[f"{name} {type(exc).__name__}"] += 1
            await asyncio.sleep(0.1)
    return {name: {"n": len(v), "p50_ms": harness.ms(harness.percentile(v, 50)),
                   "p99_ms": harness.ms(harness.percentile(v, 99))} for name, v in lat.items()} | \
        {"failures": dict(failures)}


def probe_process(base: str, seconds: float, results: Any) -> None:
    results.put({"probe": asyncio.run(_probe(base, seconds))})


# --- servers ---------------------------------------------------------------------------------------------

def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env.update(PYTHONPATH=str(ROOT), LANGSMITH_TRACING="false",
               THREADLINE_CONFIG=str(harness.PROJECT_DIR / "langgraph.json"),
               THREADLINE_LOG_LEVEL="warning", THREADLINE_TRUSTED_PROXIES="127.0.0.1", **extra)
    return env


def _start(stack: str, mode: str, tmp: Path, stack_ctx: ExitStack) -> tuple[str, list[int], Any, str | None]:
    """Start the stack; (API base URLs, server pids, a function counting runs in its database, the database's
    URL on PostgreSQL)."""
    limits = LIMITS if mode == "limits" else {}
    py = sys.executable
    if stack == "embedded":
        db = tmp / f"{mode}.db"
        port = harness.free_port()
        proc = stack_ctx.enter_context(harness.server_process(
            "embedded", [py, "-m", "threadline", "serve", "--port", str(port)], tmp,
            _env({"THREADLINE_DATABASE_URL": f"sqlite:///{db}", **limits}), tmp / f"embedded-{mode}.log"))
        base = f"http://127.0.0.1:{port}"
        asyncio.run(harness.wait_ready(base, proc, 60))
        return base, [proc.pid], lambda: _sqlite_runs(db), None
    import psycopg

    name = f"threadline_load_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    stack_ctx.callback(_drop_database, name)
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    env = _env({"THREADLINE_DATABASE_URL": url, "THREADLINE_REDIS_URL": REDIS,
                "THREADLINE_REDIS_KEY_PREFIX": f"tlload-{name}", **limits})
    import subprocess

    subprocess.run([py, "-m", "threadline", "migrate"], env=env, check=True, capture_output=True, timeout=120)
    pids, bases = [], []
    for i in range(2):
        port = harness.free_port()
        proc = stack_ctx.enter_context(harness.server_process(
            f"api{i}", [py, "-m", "threadline", "serve", "--port", str(port), "--workers", "0"], tmp, env,
            tmp / f"scaleout-{mode}-api{i}.log"))
        bases.append(f"http://127.0.0.1:{port}")
        asyncio.run(harness.wait_ready(bases[-1], proc, 60))
        pids.append(proc.pid)
    for i in range(2):
        proc = stack_ctx.enter_context(harness.server_process(
            f"worker{i}", [py, "-m", "threadline", "worker", "--workers", "10"], tmp, env,
            tmp / f"scaleout-{mode}-worker{i}.log"))
        pids.append(proc.pid)
    return ",".join(bases), pids, lambda: _pg_runs(url), url


class _PgSampler:
    """Samples the load database's sessions every 100 ms in a thread: per application and state, how many
    sessions and on what they wait (`wait_event_type:wait_event`), and the longest-running active statements."""

    def __init__(self, url: str) -> None:
        import threading

        self.url, self.samples = url, 0
        self.states: Counter[str] = Counter()
        self.slow: Counter[str] = Counter()  # active for >= 100 ms: statement head
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psycopg

        db = self.url.rsplit("/", 1)[1]
        with psycopg.connect(PG_ADMIN, autocommit=True, application_name="bench:sampler") as conn:
            while not self._stop.wait(0.1):
                rows = conn.execute(
                    "SELECT application_name, state, coalesce(wait_event_type || ':' || wait_event, ''), "
                    "extract(epoch FROM now() - query_start), left(regexp_replace(query, '\\s+', ' ', 'g'), 60) "
                    "FROM pg_stat_activity WHERE datname = %s AND application_name <> 'bench:sampler'",
                    (db,)).fetchall()
                self.samples += 1
                for app, state, wait, running, query in rows:
                    self.states[f"{app or '-'} | {state} | {wait}"] += 1
                    if state == "active" and running is not None and running >= 0.1:
                        self.slow[f"{wait} | {query}"] += 1

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(10)
        n = max(self.samples, 1)
        return {"samples": self.samples,
                "sessions_per_sample": {k: round(v / n, 2) for k, v in self.states.most_common(25)},
                "active_over_100ms": dict(self.slow.most_common(15))}


def _drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _sqlite_runs(db: Path) -> dict[str, tuple[str, int]]:
    with sqlite3.connect(db) as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute("SELECT run_id, status, attempt FROM runs")}


def _pg_runs(url: str) -> dict[str, tuple[str, int]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute("SELECT run_id, status, attempt FROM runs")}


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# --- one phase -----------------------------------------------------------------------------------------

def phase(stack: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tl-load-") as folder, ExitStack() as stack_ctx:
        tmp = Path(folder)
        bases, pids, runs_in_db, database = _start(stack, mode, tmp, stack_ctx)
        urls = bases.split(",")
        results: Any = mp.get_context("spawn").Queue()
        ctx = mp.get_context("spawn")
        per = max(1, args.clients // args.procs)
        procs = [ctx.Process(target=load_process, args=(urls[i % len(urls)], per, args.seconds, f"10.0.0.{i + 1}",
                                                         results)) for i in range(args.procs)]
        procs.append(ctx.Process(target=probe_process, args=(urls[0], args.seconds + 5, results)))
        for p in procs:
            p.start()
        rss: list[list[int]] = []
        sampler = _PgSampler(database) if args.sample_pg and database else None
        t0 = time.monotonic()
        while any(p.is_alive() for p in procs) and time.monotonic() - t0 < args.seconds + 120:
            rss.append([_rss_kb(pid) for pid in pids])
            time.sleep(1.0)
        activity = sampler.stop() if sampler is not None else None
        gathered = [results.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        status: Counter[str] = Counter()
        created: list[str] = []
        cpu = 0.0
        probe: dict[str, Any] = {}
        for g in gathered:
            if "probe" in g:
                probe = g["probe"]
                continue
            status.update(g["status"])
            created += g["runs"]
            cpu += g["cpu_s"]
        # Drain: every created run ends (bounded).
        drained_at = time.monotonic()
        db: dict[str, tuple[str, int]] = {}
        while time.monotonic() - drained_at < 180:
            db = runs_in_db()
            if all(s not in ("pending", "running") for s, _ in db.values()):
                break
            time.sleep(1.0)
        lost = [r for r in created if r not in db or db[r][0] in ("pending", "running")]
        twice = [r for r, (_, attempt) in db.items() if attempt > 1]
        by_code: Counter[str] = Counter()
        for key, n in status.items():
            by_code[key.rsplit(" ", 1)[1]] += n
        return {
            "stack": stack, "mode": mode, "clients": per * args.procs, "client_processes": args.procs,
            "seconds": args.seconds, "requests": sum(status.values()), "by_status": dict(sorted(by_code.items())),
            "by_action": dict(sorted(status.items())),
            "5xx": sum(n for code, n in by_code.items() if code.isdigit() and code.startswith("5")),
            "runs_created": len(set(created)), "runs_in_db": len(db),
            "runs_by_status": dict(Counter(s for s, _ in db.values())), "runs_lost": len(lost),
            "runs_run_twice": len(twice), "drain_s": round(time.monotonic() - drained_at, 1), "probe": probe,
            "rss_mb": {"first": [round(k / 1024) for k in (rss[0] if rss else [])],
                       "max": [round(max(col) / 1024) for col in zip(*rss, strict=False)] if rss else [],
                       "last": [round(k / 1024) for k in (rss[-1] if rss else [])]},
            "client_cpu_s": round(cpu, 1), "client_cpu_share_of_wall": round(cpu / max(args.seconds, 1e-9), 2),
        } | ({"pg_activity": activity} if activity is not None else {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stack", choices=("embedded", "scaleout", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--modes", default="limits,none", help="which phases: limits, none, or both (the default)")
    parser.add_argument("--sample-pg", action="store_true",
                        help="sample pg_stat_activity every 100 ms during the load (scaleout): what the database's "
                             "sessions wait on, per application, in the report's `pg_activity`")
    args = parser.parse_args()
    args.seconds = min(args.seconds, 300.0)  # bounded, whatever is asked
    args.clients = min(args.clients, 2000)
    stacks = ("embedded", "scaleout") if args.stack == "both" else (args.stack,)
    for stack in stacks:
        report = {"meta": {"argv": sys.argv[1:], "cpus": os.cpu_count(), "limits": LIMITS,
                           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                  "phases": [phase(stack, mode, args) for mode in args.modes.split(",")]}
        out = harness.BENCH_DIR / "results" / f"load-{stack}.json"
        out.write_text(json.dumps(report, indent=2) + "\n")
        for p in report["phases"]:
            print(f"{p['stack']:9} {p['mode']:6} requests={p['requests']} 5xx={p['5xx']} by_status={p['by_status']} "
                  f"runs created={p['runs_created']} lost={p['runs_lost']} twice={p['runs_run_twice']} "
                  f"probe={p['probe']} rss_mb={p['rss_mb']} client_cpu_s={p['client_cpu_s']}")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
