"""Scale-out cells of the benchmark: PostgreSQL + Redis, one API process, N worker processes.

Called by ``bench/run.py`` after the other columns (``--skip scaleout`` drops it). For each N in
``--scaleout-workers`` (default 1,2,4):

* a fresh PostgreSQL database ``threadline_bench_<token>`` (created through the admin connection,
  ``--scaleout-pg-admin-url``) and a fresh Redis key prefix ``tlbench-<token>``;
* ``threadline migrate``, then ONE ``threadline serve --workers 0`` (API only) and N
  ``threadline worker --workers <slots>`` processes, configured through the documented environment
  (``THREADLINE_DATABASE_URL``, ``THREADLINE_REDIS_URL``, ``THREADLINE_REDIS_KEY_PREFIX``,
  ``THREADLINE_CONFIG``);
* once the API answers ``/ok?check_db=1`` and every worker has printed its start line: a warm-up,
  then ``POST /threads/{id}/runs/wait`` at each ``--concurrency`` with ``run_cell`` (``bench/harness.py``, as
  run.py's columns: same graph, same body, same checks, same client (``client_session``: one aiohttp
  session per cell), a distinct pre-created thread per request). After each cell the
  ``runs`` table says which worker process ran how many runs (fan-out), and at the end whether any
  run was retried or did not succeed.

Every process is stopped (SIGTERM to its own process group, SIGKILL after a grace period), the
database dropped and the Redis keys deleted in ``finally`` blocks, whatever happened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import harness  # what run.py's columns and these cells share: cells, checks, the client, formatting

from threadline.cli import run_loop  # the bench runs in the venv it launches threadline from
from threadline.settings import redact_url

DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
LATENCY_AIM_RATIO = 2.0  # the aim: PostgreSQL wait latency within 2x of the embedded default
POLLING_FLOOR_MS = 2000.0  # the latency floor the scale-out issue cites for peers that poll for queued runs
ENDPOINT = "POST /threads/{id}/runs/wait"
WORKER_LINE = re.compile(r"worker (\S+): (\d+) slots")


def positive_ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def positive_int(text: str) -> int:
    values = positive_ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}")
    return values[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scaleout-workers", type=positive_ints, default=[1, 2, 4],
                   help="Comma-separated worker-process counts for the scale-out cells (default 1,2,4).")
    p.add_argument("--scaleout-slots", type=positive_int, default=10,
                   help="--workers (slots) of each `threadline worker` process (default 10).")
    p.add_argument("--scaleout-pg-admin-url", default=os.environ.get("BENCH_PG_ADMIN_URL", DEFAULT_PG_ADMIN_URL),
                   help="PostgreSQL connection that may CREATE/DROP DATABASE "
                        f"(default $BENCH_PG_ADMIN_URL or {DEFAULT_PG_ADMIN_URL}).")
    p.add_argument("--scaleout-io-seconds", type=float, default=0.5,
                   help="The I/O-bound cell: each run waits this long (graph `wait`, an asyncio.sleep, as an agent "
                        "waits on a model), with every slot of every worker process busy; 0 drops it (default 0.5).")
    p.add_argument("--scaleout-io-rounds", type=positive_int, default=8,
                   help="Runs per slot in the I/O-bound cell (default 8).")
    p.add_argument("--scaleout-redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS_URL),
                   help=f"Redis for the scale-out cells (default $BENCH_REDIS_URL or {DEFAULT_REDIS_URL}).")
    p.add_argument("--scaleout-pool-size", type=int, default=0,
                   help="THREADLINE_DATABASE_POOL_SIZE of the worker processes (0: the defaults; the API process "
                        "keeps them), so that many worker processes fit under PostgreSQL's max_connections, shared "
                        "with whatever else uses it.")
    p.add_argument("--scaleout-broker", choices=("redis", "postgres"), default="redis",
                   help="The scale-out cells' broker: redis (PostgreSQL + Redis, the default) or postgres "
                        "(PostgreSQL alone: no THREADLINE_REDIS_URL, PostgreSQL is the broker too).")


def stack_name(broker: str) -> str:
    return "PostgreSQL + Redis" if broker == "redis" else "PostgreSQL alone (the broker too)"


def cpu_note() -> str:
    cpus = os.cpu_count() or 0
    return (
        f"this machine has {cpus} CPU core{'s' if cpus != 1 else ''}: the API process, the worker processes and the "
        "bench client all share them. More processes than cores cannot scale CPU-bound throughput, so these cells "
        "show the overhead and the correctness of fan-out, not linear speed-up."
    )


# --------------------------------------------------------------------------- services


def database_url(admin_url: str, dbname: str) -> str:
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(admin_url)
    info["dbname"] = dbname
    user = info.get("user") or "postgres"
    password = f":{info['password']}" if info.get("password") else ""
    return f"postgresql://{user}{password}@{info.get('host') or '127.0.0.1'}:{info.get('port') or 5432}/{dbname}"


def check_services(cfg: argparse.Namespace) -> str | None:
    """None when PostgreSQL and Redis (when it is the broker) answer; else why not."""
    try:
        import psycopg
        import redis
    except ImportError as exc:
        return f"psycopg / redis not installed in this venv ({exc})"
    try:
        with psycopg.connect(cfg.scaleout_pg_admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001
        return f"PostgreSQL unreachable at {redact_url(cfg.scaleout_pg_admin_url)}: {exc}"
    if cfg.scaleout_broker != "redis":
        return None
    try:
        client = redis.Redis.from_url(cfg.scaleout_redis_url, socket_connect_timeout=5)
        client.ping()
        client.close()
    except Exception as exc:  # noqa: BLE001
        return f"Redis unreachable at {redact_url(cfg.scaleout_redis_url)}: {exc}"
    return None


def create_database(admin_url: str, dbname: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')


def drop_database(admin_url: str, dbname: str) -> str | None:
    """Drop (forcing out any connection left); returns an error message instead of raising."""
    import psycopg

    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        return None
    except Exception as exc:  # noqa: BLE001
        return f"could not drop database {dbname}: {type(exc).__name__}: {exc}"


def delete_redis_keys(redis_url: str, prefix: str) -> str | None:
    import redis

    try:
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=5)
        try:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start:start + 500])
        finally:
            client.close()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"could not delete Redis keys {prefix}:*: {type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- processes


class Procs:
    """The processes of one scale-out cell, each in its own process group (so each can be stopped with
    everything it spawned, and Ctrl-C in the terminal reaches only the bench, which then stops them)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, subprocess.Popen, Any, Path]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
        log_file = open(log_path, "wb")  # noqa: SIM115 - closed by stop_all()
        try:
            proc = subprocess.Popen(argv, cwd=str(harness.PROJECT_DIR), env=env, stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except BaseException:
            log_file.close()
            raise
        self.items.append((name, proc, log_file, log_path))
        return proc

    def dead(self) -> list[str]:
        return [f"{name} exited with code {p.returncode}" for name, p, _, _ in self.items if p.poll() is not None]

    def stop_all(self, term_grace_s: float = 10.0, kill_grace_s: float = 5.0) -> None:
        """SIGTERM to every group at once, wait up to `term_grace_s`; SIGKILL what is left."""
        for sig, grace in ((signal.SIGTERM, term_grace_s), (signal.SIGKILL, kill_grace_s)):
            alive = [p for _, p, _, _ in self.items if p.poll() is None]
            if not alive:
                break
            for p in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)  # only the group this script created (start_new_session=True)
            deadline = time.monotonic() + grace
            for p in alive:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
        for _, _, log_file, _ in self.items:
            log_file.close()


def clean_env(base_env: dict[str, str], db_url: str, redis_url: str, prefix: str) -> dict[str, str]:
    # THREADLINE_* from the caller's shell must not change what is measured.
    env = {k: v for k, v in base_env.items() if not k.startswith("THREADLINE_")}
    env.update({
        "THREADLINE_DATABASE_URL": db_url,
        "THREADLINE_REDIS_URL": redis_url,
        "THREADLINE_REDIS_KEY_PREFIX": prefix,
        "THREADLINE_CONFIG": str(harness.PROJECT_DIR / "langgraph.json"),
        "THREADLINE_LOG_LEVEL": "warning",
    })
    return env


async def wait_workers(procs: list[tuple[subprocess.Popen, Path]], timeout_s: float) -> list[str]:
    """Wait until every worker printed its start line (`… worker <id>: <n> slots, …`); their worker ids."""
    ids: list[str | None] = [None] * len(procs)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for i, (proc, log_path) in enumerate(procs):
            if ids[i] is None:
                m = WORKER_LINE.search(log_path.read_text(errors="replace"))
                if m:
                    ids[i] = m.group(1)
                elif proc.poll() is not None:
                    raise harness.ServerFailed(f"worker {i + 1} exited with code {proc.returncode} before it started")
        if all(ids):
            return [str(x) for x in ids]
        await asyncio.sleep(0.2)
    missing = [i + 1 for i, x in enumerate(ids) if x is None]
    raise harness.ServerFailed(f"worker(s) {missing} did not start within {timeout_s:.0f}s")


# --------------------------------------------------------------------------- measurement


def runs_per_worker(db_url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT coalesce(worker_id, ''), count(*) FROM runs WHERE status = 'success' GROUP BY 1").fetchall()
    return {str(w): int(n) for w, n in rows}


def database_counters(db_url: str) -> dict[str, int]:
    """The database's own counters (`pg_stat_database`): transactions and rows written, for the cost per run."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, tup_fetched "
                           "FROM pg_stat_database WHERE datname = current_database()").fetchone()
    keys = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "tup_fetched")
    return {k: int(v) for k, v in zip(keys, row or (0,) * len(keys), strict=True)}


def backend_pids(db_url: str) -> list[int]:
    import psycopg

    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid()").fetchall()
    return [int(r[0]) for r in rows]


def connections(db_url: str) -> int:
    """Connections open to this database (ours excluded): the processes' pools, after a cell (they do not shrink
    for minutes, so this is about the most the cell held), to check against `max_connections`."""
    return len(backend_pids(db_url))


def cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds (user + system) so far of each component's processes (and their process groups' others)."""
    from procstat import _stat

    def of(pid: int) -> float:
        found = _stat(pid)
        return found[1] if found else 0.0

    return {name: sum(of(pid) for pid in group) for name, group in pids.items()}


def run_outcomes(db_url: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        by_status = dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
        retried = conn.execute("SELECT count(*) FROM runs WHERE attempt > 1").fetchone()[0]
    return {"runs_by_status": {str(k): int(v) for k, v in by_status.items()}, "runs_retried": int(retried)}


async def measure(n_workers: int, base_url: str, procs: Procs, api: subprocess.Popen,
                  workers: list[tuple[subprocess.Popen, Path]], db_url: str, cfg: argparse.Namespace,
                  concurrencies: list[int]) -> dict[str, Any]:
    t0 = time.perf_counter()
    await harness.wait_ready(base_url, api, cfg.startup_timeout)
    worker_ids = await wait_workers(workers, max(5.0, cfg.startup_timeout - (time.perf_counter() - t0)))
    ready_s = time.perf_counter() - t0
    max_c = max(concurrencies)
    body = {"assistant_id": harness.GRAPH_ID, "input": harness.RUN_INPUT}  # the same request as run.py's cells

    # The same client as run.py's server columns (one aiohttp session, max_c + 8 keep-alive connections).
    async with harness.client_session(base_url, max_c, cfg.request_timeout) as client:
        # readiness: PostgreSQL answers, Redis pings
        r = await harness.fetch(client, "GET", "/ok", params={"check_db": "1"})
        harness.raise_for(r, "GET /ok?check_db=1")
        harness.log(f"  scale-out {n_workers}w: ready after {ready_s:.1f}s (workers {', '.join(worker_ids)})")

        async def create_threads(count: int) -> list[str]:
            ids: list[str] = [""] * count

            async def make(i: int) -> None:
                r = await harness.fetch(client, "POST", "/threads", json_body={})
                harness.raise_for(r, "POST /threads")
                ids[i] = r.json()["thread_id"]

            res = await harness.run_cell(make, count, min(8, max_c), cfg.request_timeout * 2)
            if res.errors or res.completed < count:
                raise harness.CellFailed(f"creating threads failed: {res.first_error or 'time limit'}")
            return ids

        def thread_wait_op(thread_ids: list[str]) -> Callable[[int], Awaitable[None]]:
            async def op(i: int) -> None:
                r = await harness.fetch(client, "POST", f"/threads/{thread_ids[i]}/runs/wait", json_body=body)
                harness.raise_for(r, "POST /threads/{id}/runs/wait")
                harness.check_values(r.json())

            return op

        # Warm-up (untimed): enough runs, concurrently enough, that every worker process likely ran some.
        warm_n = max(cfg.warmup, 4 * n_workers)
        warm = await harness.run_cell(thread_wait_op(await create_threads(warm_n)), warm_n,
                                    min(max_c, max(4, 2 * n_workers)), cfg.cell_seconds)
        if warm.completed == 0:
            raise harness.ServerFailed(f"warm-up failed: {warm.first_error}")

        cells: dict[str, Any] = {}
        for c in concurrencies:
            n = cfg.n_for(c)
            try:
                thread_ids = await create_threads(n)  # not timed
            except harness.CellFailed as exc:
                cells[str(c)] = harness.failed_cell(n, c, str(exc))
                harness.log(f"  scale-out {n_workers}w thread c={c:<3} FAILED: {exc}")
                continue
            before = runs_per_worker(db_url)
            res = await harness.run_cell(thread_wait_op(thread_ids), n, c, cfg.cell_seconds)
            after = runs_per_worker(db_url)
            s = res.summary()
            s["p95_ms"] = harness.ms(harness.percentile(res.latencies, 95))
            s["max_ms"] = harness.ms(max(res.latencies)) if res.latencies else None
            s["runs_per_worker"] = [after.get(w, 0) - before.get(w, 0) for w in worker_ids]
            others = sum(v - before.get(w, 0) for w, v in after.items() if w not in worker_ids)
            if others:
                s["runs_by_unknown_worker"] = others
            cells[str(c)] = s
            harness.log(f"  scale-out {n_workers}w thread c={c:<3} {harness.fmt_cell(s)}  "
                        f"per worker {s['runs_per_worker']}")

        pids = {"api": [api.pid], "workers": [proc.pid for proc, _ in workers]}
        io = await io_cell(n_workers, base_url, create_threads, worker_ids, db_url, cfg, pids) \
            if cfg.scaleout_io_seconds > 0 else None

    dead = procs.dead()
    if dead:
        raise harness.ServerFailed("process(es) died during the run: " + "; ".join(dead))
    return {"ready_after_s": round(ready_s, 2), "worker_ids": worker_ids, "wait": {"thread": cells},
            **({"io": io} if io is not None else {}), **run_outcomes(db_url)}


async def io_cell(n_workers: int, base_url: str, create_threads: Callable[[int], Awaitable[list[str]]],
                  worker_ids: list[str], db_url: str, cfg: argparse.Namespace,
                  pids: dict[str, list[int]]) -> dict[str, Any]:
    """Runs that wait (`--scaleout-io-seconds`), one client per slot of every worker process, so that the
    ideal is every slot always busy: slots / seconds runs per second. `efficiency` = runs/s over that. The
    cell has a session of its own, with a connection per client (a session sized for the other cells would
    queue the requests in the client: it did, and capped every worker count at the same runs/s)."""
    seconds, c = cfg.scaleout_io_seconds, cfg.scaleout_slots * n_workers
    n = c * cfg.scaleout_io_rounds
    body = {"assistant_id": "wait", "input": {"seconds": seconds}}
    thread_ids = await create_threads(n)

    async with harness.client_session(base_url, c, cfg.request_timeout) as client:
        async def op(i: int) -> None:
            r = await harness.fetch(client, "POST", f"/threads/{thread_ids[i]}/runs/wait", json_body=body)
            harness.raise_for(r, "POST /threads/{id}/runs/wait (wait graph)")
            if (r.json() or {}).get("waited") != 1:
                raise RuntimeError(f"unexpected output: {r.text[:300]}")

        before, counters = runs_per_worker(db_url), database_counters(db_url)
        pids["postgres"] = backend_pids(db_url)
        cpu, client_cpu = cpu_seconds(pids), time.process_time()
        res = await harness.run_cell(op, n, c, max(cfg.cell_seconds, 4 * cfg.scaleout_io_rounds * seconds))
        # Backends the pools opened during the cell: all their CPU is the cell's (counted from 0). Missing them
        # undercounted PostgreSQL's CPU per run, more so with larger pools (they grow under load).
        opened = [pid for pid in backend_pids(db_url) if pid not in pids["postgres"]]
        pids["postgres"] = [*pids["postgres"], *opened]
        cpu_after, client_after = cpu_seconds(pids), time.process_time()
        after, spent = runs_per_worker(db_url), database_counters(db_url)
        held = connections(db_url)
    out = res.summary()
    if res.completed:  # PostgreSQL's work per run (its statistics are sent at a transaction's end: approximate)
        out["database_per_run"] = {k: round((spent[k] - counters[k]) / res.completed, 1) for k in counters}
        # CPU per run of each component, from /proc (PostgreSQL: the backends of this database connected when the
        # cell started or opened during it; its shared processes, WAL writer and checkpointer, are not counted)
        out["cpu_ms_per_run"] = {**{k: round((cpu_after[k] - cpu[k]) * 1000 / res.completed, 2) for k in cpu},
                                 "client": round((client_after - client_cpu) * 1000 / res.completed, 2)}
    out.update(seconds=seconds, concurrency=c, ideal_runs_per_s=round(c / seconds, 2),
               efficiency=round(out["runs_per_s"] / (c / seconds), 3) if out.get("runs_per_s") else None,
               p95_ms=harness.ms(harness.percentile(res.latencies, 95)),
               runs_per_worker=[after.get(w, 0) - before.get(w, 0) for w in worker_ids], pg_connections=held)
    harness.log(f"  scale-out {n_workers}w I/O-bound ({seconds:g} s runs) c={c:<3} {harness.fmt_cell(out)}  "
                f"ideal {out['ideal_runs_per_s']} runs/s, efficiency {out['efficiency']}  "
                f"per worker {out['runs_per_worker']}")
    return out


def one_config(n_workers: int, cfg: argparse.Namespace, base_env: dict[str, str], tl_argv_prefix: list[str],
               logs_dir: Path, concurrencies: list[int]) -> dict[str, Any]:
    token = uuid.uuid4().hex[:10]
    dbname = f"threadline_bench_{token}"
    prefix = f"tlbench-{token}"
    db_url = database_url(cfg.scaleout_pg_admin_url, dbname)
    env = clean_env(base_env, db_url, cfg.scaleout_redis_url, prefix)
    if cfg.scaleout_broker != "redis":  # PostgreSQL alone, as `bench/workloads.py`'s pgonly target
        del env["THREADLINE_REDIS_URL"]
    worker_env = {**env, **({"THREADLINE_DATABASE_POOL_SIZE": str(cfg.scaleout_pool_size)}
                            if cfg.scaleout_pool_size > 0 else {})}
    port = harness.free_port()
    base_url = f"http://127.0.0.1:{port}"
    api_log = logs_dir / f"scaleout-w{n_workers}-api.log"
    worker_logs = [logs_dir / f"scaleout-w{n_workers}-worker{i + 1}.log" for i in range(n_workers)]
    out: dict[str, Any] = {"database": dbname, "redis_key_prefix": prefix,
                           "logs": [str(api_log), *map(str, worker_logs)]}
    harness.log(f"\n[scale-out, {n_workers} worker process{'es' if n_workers > 1 else ''}] "
              f"db {dbname}, redis prefix {prefix}; 1 x `threadline serve --workers 0` on :{port} + "
              f"{n_workers} x `threadline worker --workers {cfg.scaleout_slots}`")
    procs = Procs()
    created = False
    cleanup_errors: list[str] = []
    try:
        create_database(cfg.scaleout_pg_admin_url, dbname)
        created = True
        mig = subprocess.run([*tl_argv_prefix, "migrate"], cwd=str(harness.PROJECT_DIR), env=env,
                             check=False, capture_output=True, text=True, timeout=cfg.startup_timeout)
        if mig.returncode != 0:
            last = [ln.strip() for ln in (mig.stderr or mig.stdout or "").splitlines() if ln.strip()][-1:]
            raise harness.ServerFailed(f"threadline migrate exited {mig.returncode}: {' '.join(last)[:400]}")
        workers = []
        for i, log_path in enumerate(worker_logs):
            argv = [*tl_argv_prefix, "worker", "--workers", str(cfg.scaleout_slots)]
            workers.append((procs.start(f"worker {i + 1}", argv, worker_env, log_path), log_path))
        api = procs.start("api", [*tl_argv_prefix, "serve", "--host", "127.0.0.1", "--port", str(port),
                                  "--workers", "0"], env, api_log)
        out.update(run_loop(measure(n_workers, base_url, procs, api, workers, db_url, cfg, concurrencies)))
    except BaseException as exc:
        out["failed"] = f"{type(exc).__name__}: {exc}"[:800]
        harness.log(f"  scale-out {n_workers}w: FAILED: {out['failed']}")
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt / SystemExit: clean up (finally), then stop
        for path in (api_log, *worker_logs):
            if path.exists():
                harness.log(f"  --- last lines of {path} ---\n{harness.tail(path, 10)}")
    finally:
        procs.stop_all()
        if created:
            err = drop_database(cfg.scaleout_pg_admin_url, dbname)
            if err:
                cleanup_errors.append(err)
        err = delete_redis_keys(cfg.scaleout_redis_url, prefix) if cfg.scaleout_broker == "redis" else None
        if err:
            cleanup_errors.append(err)
        for e in cleanup_errors:
            harness.log(f"  scale-out {n_workers}w cleanup: {e}")
    if cleanup_errors:
        out["cleanup_errors"] = cleanup_errors
    out["log_warnings"] = log_warnings([api_log, *worker_logs])
    return out


def log_warnings(paths: list[Path]) -> dict[str, Any]:
    """WARNING/ERROR lines the processes logged (e.g. a lease lost, a wake-up lost): none expected."""
    lines = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        lines += [f"{path.name}: {line.strip()}" for line in text.splitlines()
                  if " WARNING " in line or " ERROR " in line or line.startswith("Traceback")]
    return {"count": len(lines), "first": lines[:5]}


def run(cfg: argparse.Namespace, results: dict[str, Any], base_env: dict[str, str], tl_argv_prefix: list[str],
        logs_dir: Path) -> dict[str, Any]:
    """All scale-out cells, and their comparisons (with the embedded `threadline` column of `results`)."""
    counts = list(cfg.scaleout_workers)
    concurrencies = cfg.concurrency if 1 in cfg.concurrency else [1, *cfg.concurrency]  # c=1 gives latency
    settings = {
        "endpoint": ENDPOINT, "worker_processes": counts, "slots_per_worker": cfg.scaleout_slots,
        "api_processes": 1, "concurrency": concurrencies, "cpu_count": os.cpu_count(),
        "pg_admin_url": redact_url(cfg.scaleout_pg_admin_url), "redis_url": redact_url(cfg.scaleout_redis_url),
        "broker": cfg.scaleout_broker, "pool_size": cfg.scaleout_pool_size, "note": cpu_note(),
    }
    harness.log(f"\n[scale-out] {stack_name(cfg.scaleout_broker)}, {ENDPOINT}; worker processes {counts}, "
              f"{cfg.scaleout_slots} slots each (threadline worker --workers {cfg.scaleout_slots}), 1 API process "
              f"(threadline serve --workers 0)\n  Note: {cpu_note()}")
    why_not = check_services(cfg)
    if why_not:
        harness.log(f"  scale-out: SKIPPED: {why_not}")
        return {"skipped": why_not, "settings": settings}
    # SIGTERM (a CI timeout, `kill`) would end the bench without running `finally`, leaving the worker
    # processes and the database behind: while these cells run it raises SystemExit instead.
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        by_n = {str(n): one_config(n, cfg, base_env, tl_argv_prefix, logs_dir, concurrencies) for n in counts}
    finally:
        signal.signal(signal.SIGTERM, previous)
    return {"settings": settings, "workers": by_n, "comparisons": compare(by_n, results, counts, concurrencies)}


def _sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def compare(by_n: dict[str, Any], results: dict[str, Any], counts: list[int],
            concurrencies: list[int]) -> dict[str, Any]:
    def cell(n: int, c: int) -> dict[str, Any]:
        return ((by_n.get(str(n)) or {}).get("wait") or {}).get("thread", {}).get(str(c)) or {}

    base = min(counts)
    throughput = {
        str(n): {str(c): harness.ratio(cell(n, c).get("runs_per_s"), cell(base, c).get("runs_per_s"))
                 for c in concurrencies}
        for n in counts if n != base
    }
    embedded = results.get("threadline") or {}
    emb_cell = ((embedded.get("wait") or {}).get("thread") or {}).get("1") or {}
    pg = cell(base, 1)
    ratio_p50 = harness.ratio(pg.get("p50_ms"), emb_cell.get("p50_ms"))
    return {
        "throughput_over_baseline": {"baseline_worker_processes": base, "by_worker_processes": throughput},
        "wait_latency_c1": {
            "worker_processes": base,
            "postgres_p50_ms": pg.get("p50_ms"),
            "postgres_p95_ms": pg.get("p95_ms"),
            "embedded_p50_ms": emb_cell.get("p50_ms"),
            "embedded_skipped": embedded.get("skipped"),
            "postgres_over_embedded_p50": ratio_p50,
            "aim_max_ratio": LATENCY_AIM_RATIO,
            "within_aim": None if ratio_p50 is None else ratio_p50 <= LATENCY_AIM_RATIO,
            "polling_floor_ms": POLLING_FLOOR_MS,
            "postgres_p50_over_polling_floor": harness.ratio(pg.get("p50_ms"), POLLING_FLOOR_MS),
        },
    }


# --------------------------------------------------------------------------- output


def render(out: dict[str, Any] | None) -> str:
    if not out:
        return ""
    fmt = harness.fmt
    settings = out.get("settings") or {}
    lines = [(f"Scale-out: {ENDPOINT} on {stack_name(settings.get('broker', 'redis'))}; 1 API process "
              "(threadline serve --workers 0) + "
              f"N worker processes (threadline worker --workers {settings.get('slots_per_worker', '?')})")]
    if out.get("skipped"):
        lines.append(f"  SKIPPED: {out['skipped']}")
        return "\n\n" + "\n".join(lines)
    lines.append(f"  Note: {settings.get('note', cpu_note())}")
    base = (out.get("comparisons") or {}).get("throughput_over_baseline", {}).get("baseline_worker_processes", 1)
    hdr = (f"{'workers':>7}{'c':>5}{'n':>6}{'err':>5}{'runs/s':>9}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}"
           f"{f'runs/s vs {base}w':>15}  runs per worker process")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    errs: list[str] = []
    thr = (out.get("comparisons") or {}).get("throughput_over_baseline", {}).get("by_worker_processes", {})
    for n, data in (out.get("workers") or {}).items():
        if data.get("failed"):
            lines.append(f"{n:>7}  FAILED: {' | '.join(data['failed'].splitlines())[:300]}")
            continue
        for c, s in data["wait"]["thread"].items():
            if s.get("failed"):
                lines.append(f"{n:>7}{c:>5}  FAILED (see errors below)")
            else:
                flag = "*" if s["truncated_by_time_limit"] else ""
                vs = "1.00 (base)" if int(n) == base else fmt((thr.get(n) or {}).get(c), 2)
                lines.append(
                    f"{n:>7}{c:>5}{str(s['completed']) + flag:>6}{s['errors']:>5}{fmt(s['runs_per_s']):>9}"
                    f"{fmt(s['p50_ms'], 2):>9}{fmt(s.get('p95_ms'), 2):>9}{fmt(s['p99_ms'], 2):>9}"
                    f"{fmt(s.get('max_ms'), 2):>9}{vs:>15}"
                    f"  {s.get('runs_per_worker')}"
                )
            if s.get("first_error"):
                errs.append(f"  {n}w c={c}: {s['first_error']}")
        bad = {k: v for k, v in data.get("runs_by_status", {}).items() if k != "success"}
        warn = data.get("log_warnings") or {}
        lines.append(f"{'':>7}  runs in db: {sum(data.get('runs_by_status', {}).values())}, not success: "
                     f"{bad or 0}, retried (attempt > 1): {data.get('runs_retried', '-')}, "
                     f"warnings in process logs: {warn.get('count', '-')}")
        errs += [f"  {n}w log: {line[:300]}" for line in warn.get("first") or []]
    lines.append(f"  (* = cell stopped early by --cell-seconds; runs/s vs {base}w = runs/s of this row / the same c "
                 f"with {base} worker process{'es' if base > 1 else ''}; max = slowest request of the cell)")
    io_rows = {n: data["io"] for n, data in (out.get("workers") or {}).items() if data.get("io")}
    if io_rows:
        one = (io_rows.get("1") or {}).get("runs_per_s")
        lines.append("")
        lines.append("I/O-bound runs (graph `wait`: one asyncio.sleep; one client per slot of every worker process)")
        lines.append(f"{'workers':>7}{'c':>5}{'sleep s':>9}{'runs/s':>9}{'ideal':>8}{'effic.':>8}{'vs 1w':>7}"
                     f"{'p50':>9}{'p95':>9}  per worker")
        for n, s in io_rows.items():
            vs = fmt(s["runs_per_s"] / one, 2) if one and s.get("runs_per_s") else "-"
            errs += [f"  {n}w I/O-bound: PostgreSQL per run: {s['database_per_run']}"] if s.get("database_per_run") \
                else []
            errs += [f"  {n}w I/O-bound: CPU ms per run: {s['cpu_ms_per_run']}"] if s.get("cpu_ms_per_run") else []
            errs += [f"  {n}w I/O-bound: PostgreSQL connections held after the cell: {s['pg_connections']}"] \
                if s.get("pg_connections") is not None else []
            lines.append(f"{n:>7}{s['concurrency']:>5}{s['seconds']:>9g}{fmt(s.get('runs_per_s')):>9}"
                         f"{fmt(s['ideal_runs_per_s']):>8}{fmt(s.get('efficiency'), 2):>8}{vs:>7}"
                         f"{fmt(s.get('p50_ms'), 1):>9}{fmt(s.get('p95_ms'), 1):>9}  {s.get('runs_per_worker')}")
    lat = (out.get("comparisons") or {}).get("wait_latency_c1") or {}
    if lat:
        emb = (f"{fmt(lat.get('embedded_p50_ms'), 2)} ms" if lat.get("embedded_p50_ms") is not None
               else f"n/a ({lat.get('embedded_skipped') or 'no c=1 thread cell'})")
        aim = {True: "within the 2x aim", False: "NOT within the 2x aim",
               None: "aim not evaluated"}[lat.get("within_aim")]
        lines.append("")
        lines.append(f"Wait latency of a trivial run ({ENDPOINT}, c=1)")
        lines.append(f"  PostgreSQL, {lat.get('worker_processes')} worker process(es): p50 = "
                     f"{fmt(lat.get('postgres_p50_ms'), 2)} ms, p95 = {fmt(lat.get('postgres_p95_ms'), 2)} ms")
        lines.append(f"  embedded threadline column (SQLite, same run): p50 = {emb}")
        lines.append(f"  PG/embedded p50 = {fmt(lat.get('postgres_over_embedded_p50'), 2)}  ({aim}); "
                     f"PG p50 / {POLLING_FLOOR_MS:.0f} ms floor of polling peers = "
                     f"{fmt(lat.get('postgres_p50_over_polling_floor'), 3)}")
    for n, data in (out.get("workers") or {}).items():
        for e in data.get("cleanup_errors") or []:
            errs.append(f"  {n}w cleanup: {e}")
    if errs:
        lines.append("")
        lines.append("Scale-out: first error per cell, first warnings of the process logs")
        lines.extend(errs)
    return "\n\n" + "\n".join(lines)
