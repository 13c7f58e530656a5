#!/usr/bin/env python
"""The shapes real agents have, in one run, against every target (issue 24).

    python bench/workloads.py --quick          # a few minutes: 4,000 tokens x 8 clients (2 modes), agent, large state
    python bench/workloads.py                  # the full set (see PROFILES)
    python bench/workloads.py --targets floor,embedded --only agent
    python bench/workloads.py --quick --threadline-src /tmp/before   # A/B: that checkout's package too, alternated

Targets (each started fresh for each workload, one at a time, never concurrently):

* ``floor``     - the same graphs in a child process, ``InMemorySaver``, driven with ``graph.astream`` & co;
* ``embedded``  - ``threadline serve`` on a fresh SQLite file (its default in-process workers);
* ``pg``        - ``threadline serve --workers 0`` + ``threadline worker`` processes on a fresh PostgreSQL
                  database and Redis key prefix (``bench/scaleout.py``'s helpers);
* ``pgonly``    - the same processes on PostgreSQL alone (no Redis URL: PostgreSQL is the broker too); not in
                  the default targets, ask for it with ``--targets``;
* ``pg1``       - PostgreSQL + Redis in one process: ``threadline serve`` with its in-process workers (the
                  scale-out stack where each process both serves and runs: what one such process holds and
                  spends against the two of ``pg``); not in the default targets either;
* ``reference`` - ``langgraph dev`` (LangGraph's own server), skipped with the reason if it is not installed.

For each (workload, target): wall time of the measured part, its ratio to the floor and to the reference, the
CPU seconds of the target's processes (utime + stime from /proc, every process of the target's process groups:
workers included) per token streamed and per graph step, split by role on the pg target (the API process, the
worker processes, and, outside the server CPU column, the database's backends: ``cpu_by_role_s``, and per token or
step ``cpu_ms_by_role``; printed after each cell and as a column), and the summed RSS of those processes before, at peak
(sampled every 100 ms) and ``--after-seconds`` (5) after. Writes ``bench/results/workloads-<date>.json`` and prints a
markdown table. Many short runs are ``bench/run.py``'s job (not repeated here). No assertions: a measuring tool.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import harness
import procstat
import run as bench_run  # find_reference_bin, INSTALL_HINT, package_version
import scaleout
import workload_ops as ops
from workload_ops import Workload

from threadline.cli import event_loop_name, run_loop

TARGETS = ("floor", "embedded", "pg", "pgonly", "pg1", "reference")
#: The targets on PostgreSQL (a fresh database each, `started_pg`).
PG_TARGETS = ("pg", "pgonly", "pg1")
MODES = ("messages-tuple", "messages", "values", "updates")


def stream(tokens: int, c: int, mode: str, reader: str = "full", model: str = "sync") -> Workload:
    suffix = ("" if reader == "full" else f" {reader}") + ("" if model == "sync" else f" {model}-model")
    return Workload(f"stream {tokens}x{c} {mode}{suffix}", "stream", tokens=tokens, concurrency=c, mode=mode,
                    reader=reader, model=model)


def large_state(n_read: int, n_update: int, n_history: int) -> list[Workload]:
    return [Workload(f"state 1MB GET x{n_read}", "state-read", count=n_read),
            Workload(f"thread 1MB GET x{n_read}", "thread-read", count=n_read),
            Workload(f"state 1MB POST x{n_update}", "state-update", count=n_update),
            Workload(f"state 1MB run x{n_update}", "state-run", count=n_update),
            Workload(f"history 200 ckpt x{n_history}", "history", count=n_history)]


def conversation(n_turns: int) -> Workload:
    return Workload(f"talk 400 msgs turn x{n_turns}", "talk", count=n_turns)


PROFILES: dict[str, list[Workload]] = {
    "quick": [stream(4000, 1, "messages-tuple"), stream(4000, 8, "messages-tuple"), stream(4000, 8, "messages"),
              stream(4000, 8, "messages-tuple", model="async"),
              Workload("agent 25 steps x4", "agent", concurrency=4, count=4, steps=25),
              *large_state(100, 100, 20), conversation(30)],
    "full": [stream(4000, 1, "messages-tuple"),
             *(stream(t, c, m) for t in (4000, 16000) for c in (8, 32) for m in MODES),
             stream(4000, 8, "messages-tuple", "slow"), stream(4000, 8, "messages-tuple", "resume"),
             stream(16000, 8, "messages-tuple", "resume"), stream(4000, 8, "messages-tuple", model="async"),
             stream(4000, 8, "messages", model="async"),
             Workload("agent 25 steps x16", "agent", concurrency=8, count=16, steps=25),
             *large_state(300, 300, 50), conversation(100)],
}


@dataclass(frozen=True)
class Target:
    name: str  # what the table says
    kind: str  # floor | embedded | pg | reference
    src: str | None = None  # a checkout whose `threadline` package is used (PYTHONPATH)


@dataclass
class Live:
    """A started target: where to send requests (servers) or the child to drive (floor), its process groups."""

    groups: list[int]
    base_url: str | None = None
    child: subprocess.Popen | None = None
    roles: dict[int, str] = field(default_factory=dict)  # process group -> role ("api", "worker"); default "server"
    db_url: str | None = None  # the pg target's database: its backends' CPU is read too (role "postgres")


# --------------------------------------------------------------------------- starting targets


def target_env(cfg: argparse.Namespace, target: Target) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env.update({"LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false",
                "PYTHONUNBUFFERED": "1"})
    if target.src:
        env["PYTHONPATH"] = os.pathsep.join([target.src, *filter(None, [env.get("PYTHONPATH")])])
    return env


@contextlib.contextmanager
def started(target: Target, wl: Workload, cfg: argparse.Namespace, tmp: Path) -> Iterator[Live]:
    env = target_env(cfg, target)
    log_path = cfg.logs_dir / f"workloads-{target.name.replace('@', '-')}.log"
    if target.kind == "floor":
        with open(log_path, "wb") as err:
            child = subprocess.Popen([sys.executable, __file__, "--floor-child", wl.to_json()], cwd=str(tmp), env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                     start_new_session=True, text=True)
            try:
                yield Live([child.pid], child=child)
            finally:
                harness.stop_process(child)
        return
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    if target.kind == "embedded":
        argv = [*cfg.tl_argv, "serve", "--config", str(ops.PROJECT_DIR / "langgraph.json"), "--host", "127.0.0.1",
                "--port", str(port), "--database-url", f"sqlite:///{tmp / f'{uuid.uuid4().hex}.db'}",
                "--log-level", "warning", *cfg.threadline_arg]
        with harness.server_process(target.name, argv, tmp, env, log_path) as proc:
            yield Live([proc.pid], base_url=url)
    elif target.kind == "reference":
        project = tmp / f"ref-{uuid.uuid4().hex[:8]}"
        shutil.copytree(ops.PROJECT_DIR, project, ignore=shutil.ignore_patterns("__pycache__", ".langgraph_api"))
        argv = [str(cfg.ref_bin), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port),
                "--config", str(project / "langgraph.json"), "--server-log-level", "WARNING"]
        with harness.server_process(target.name, argv, project, env, log_path) as proc:
            yield Live([proc.pid], base_url=url)
    else:
        with started_pg(target, cfg, env, port, log_path) as (groups, db_url):
            roles = {} if target.kind == "pg1" else {g: "api" if i == 0 else "worker" for i, g in enumerate(groups)}
            yield Live(groups, base_url=url, roles=roles, db_url=db_url)


@contextlib.contextmanager
def started_pg(target: Target, cfg: argparse.Namespace, env: dict[str, str], port: int,
               log_path: Path) -> Iterator[tuple[list[int], str]]:
    """A fresh database and Redis prefix, `threadline migrate`, N workers and one API process (`pg1`: one process
    that serves and runs); all gone after."""
    token = uuid.uuid4().hex[:10]
    dbname, prefix = f"threadline_bench_{token}", f"tlbench-{token}"
    db_url = scaleout.database_url(cfg.scaleout_pg_admin_url, dbname)
    env = scaleout.clean_env(env, db_url, cfg.scaleout_redis_url, prefix)
    if target.kind == "pgonly":
        del env["THREADLINE_REDIS_URL"]
    env["THREADLINE_CONFIG"] = str(ops.PROJECT_DIR / "langgraph.json")
    procs = scaleout.Procs()
    scaleout.create_database(cfg.scaleout_pg_admin_url, dbname)
    try:
        subprocess.run([*cfg.tl_argv, "migrate"], env=env, check=True, capture_output=True, timeout=120)
        workers = []
        for i in range(0 if target.kind == "pg1" else cfg.pg_workers):
            path = log_path.with_name(f"{log_path.stem}-worker{i + 1}.log")
            argv = [*cfg.tl_argv, "worker", "--workers", str(cfg.scaleout_slots), *cfg.threadline_arg]
            workers.append((procs.start(f"worker {i + 1}", argv, env, path), path))
        slots = str(cfg.scaleout_slots) if target.kind == "pg1" else "0"
        api = procs.start("api", [*cfg.tl_argv, "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", slots,
                           *cfg.threadline_arg], env, log_path)
        run_loop(scaleout.wait_workers(workers, cfg.startup_timeout))
        yield [api.pid, *(p.pid for p, _ in workers)], db_url
    finally:
        procs.stop_all()
        scaleout.drop_database(cfg.scaleout_pg_admin_url, dbname)
        if target.kind != "pgonly":
            scaleout.delete_redis_keys(cfg.scaleout_redis_url, prefix)


def threadline_file(cfg: argparse.Namespace, target: Target) -> str:
    """Where a target's processes import `threadline` from (an A/B is only one if the two differ). Asked from a
    folder without a `threadline` package, as the servers run (`python -c` puts its working folder first)."""
    python = Path(cfg.tl_argv[0]).parent / "python" if cfg.tl_argv[0] != sys.executable else Path(sys.executable)
    out = subprocess.run([str(python), "-c", "import threadline; print(threadline.__file__)"],
                         env=target_env(cfg, target),
                         cwd=str(harness.PROJECT_DIR), capture_output=True, text=True, timeout=60)
    path = out.stdout.strip() or out.stderr.strip()[-300:]
    if target.src and not path.startswith(str(Path(target.src).resolve())):
        raise SystemExit(f"--threadline-src: {target.name} would import threadline from {path}, not from {target.src}")
    return path


# --------------------------------------------------------------------------- one cell


def mb(n: int) -> float:
    return round(n / 2**20, 1)


class FloorDriver:
    """The floor's child process: it sets up and warms up on its own, runs on `go`, prints its result."""

    def __init__(self, live: Live) -> None:
        self.child = live.child

    async def prepare(self) -> None:
        line = await asyncio.to_thread(self.child.stdout.readline)
        if line.strip() != "ready":
            raise harness.ServerFailed(f"floor child: {line.strip() or 'exited'}")

    async def run(self) -> tuple[float, int, dict[str, Any]]:
        self.child.stdin.write("go\n")
        self.child.stdin.flush()
        out = json.loads(await asyncio.to_thread(self.child.stdout.readline))
        return out.pop("wall_s"), out.pop("tokens"), out

    async def close(self) -> None:
        pass


class HttpDriver:
    """A server: wait for `/ok`, warm the workload's path up (small), set the workload up; then run it."""

    def __init__(self, live: Live, wl: Workload, cfg: argparse.Namespace) -> None:
        self.live, self.wl, self.cfg = live, wl, cfg
        self.session: Any = None

    async def prepare(self) -> None:
        await harness.wait_ready(self.live.base_url, _AnyAlive(self.live.groups), self.cfg.startup_timeout)
        self.session = harness.client_session(self.live.base_url, max(self.wl.concurrency, 8), self.cfg.request_timeout)
        self.http = ops.HttpOps(self.session)
        warm = ops.warm_variant(self.wl)
        await self.http.setup(warm)
        w, _ = await ops.run(self.http, warm)
        if w.completed == 0:
            raise harness.ServerFailed(f"warm-up failed: {w.first_error}")
        await self.http.setup(self.wl)

    async def run(self) -> tuple[float, int, dict[str, Any]]:
        t0 = time.perf_counter()
        res, tokens = await ops.run(self.http, self.wl)
        wall = time.perf_counter() - t0
        return wall, tokens, {"completed": res.completed, "errors": res.errors, "first_error": res.first_error,
                              "p50_s": harness.percentile(res.latencies, 50), "max_s": max(res.latencies, default=None)}

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class PostgresBackends:
    """CPU seconds of the PostgreSQL backends connected to the pg target's database (they are the database
    server's processes, not in the target's process groups; read from /proc when they run on this machine)."""

    def __init__(self, db_url: str | None) -> None:
        self.db_url, self.start = db_url, dict[int, float]()

    def read(self) -> dict[int, float]:
        if self.db_url is None:
            return {}
        try:
            pids = scaleout.backend_pids(self.db_url)
        except Exception:  # noqa: BLE001 - a measuring aid: no backends counted
            return {}
        return {pid: st[1] for pid in pids if (st := procstat._stat(pid)) is not None}

    def begin(self) -> None:
        self.start = self.read()

    def cpu_s(self) -> float | None:
        """Since `begin()`: a backend that connected since counts whole; one that left in between is lost."""
        return sum(cpu - self.start.get(pid, 0.0) for pid, cpu in self.read().items()) if self.db_url else None


@contextlib.contextmanager
def spied(live: Live, cfg: argparse.Namespace, label: str) -> Iterator[None]:
    """With `--py-spy DIR`: `py-spy record` (raw, collapsed stacks, idle threads left out) of each root process
    of the target while the measured part runs, to DIR/<workload>-<target>-<role>-<pid>.txt (`python
    bench/workloads.py --collapse FILE` sums it by function)."""
    if not cfg.py_spy:
        yield
        return
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    spies = []
    for group in live.groups:
        out = Path(cfg.py_spy) / f"{label}-{live.roles.get(group, 'server')}-{group}.txt".replace(" ", "_")
        spies.append(subprocess.Popen([exe, "record", "-p", str(group), "-r", "250", "--format", "raw",
                                       "--nonblocking", *cfg.py_spy_arg, "-o", str(out)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # it writes its file and exits
        for spy in spies:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(timeout=30)


def collapse(path: str, top: int = 40) -> None:
    """A py-spy raw file summed by function: samples where it is on the stack (cum) and where it runs (self)."""
    cum: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames, count = stack.split(";"), int(n)
        total += count
        for frame in dict.fromkeys(frames):
            cum[frame] = cum.get(frame, 0) + count
        own[frames[-1]] = own.get(frames[-1], 0) + count
    print(f"{path}: {total} samples (on-CPU)")
    for title, table_ in (("self", own), ("cumulative", cum)):
        print(f"-- {title}")
        for frame, count in sorted(table_.items(), key=lambda kv: -kv[1])[:top]:
            print(f"{100 * count / total:6.1f}%  {frame}")


def by_role(live: Live, before: Mapping[int, float], after: Mapping[int, float]) -> dict[str, float]:
    out = dict.fromkeys(("server", "api", "worker"), 0.0)
    for group, cpu in after.items():
        role = live.roles.get(group, "server")
        out[role] += cpu - before.get(group, 0.0)
    return {role: cpu for role, cpu in out.items() if role in live.roles.values() or role == "server" and cpu}


async def measure(live: Live, wl: Workload, cfg: argparse.Namespace, target_name: str = "") -> dict[str, Any]:
    """Ready, set up and warm (untimed); then RSS before, the measured part (peak sampled), RSS after."""
    driver = FloorDriver(live) if live.child is not None else HttpDriver(live, wl, cfg)
    sampler = procstat.Sampler(live.groups)
    try:
        await driver.prepare()
        await asyncio.sleep(1.0)
        rss_before = sampler.rss()
        sampler.reset_peak()
        backends = PostgresBackends(live.db_url)
        backends.begin()
        cpu0, groups0, client0, writes0 = sampler.cpu_s(), sampler.cpu_by_group(), time.process_time(), sampler.writes()
        wgroups0 = sampler.writes_by_group()
        sampler.start()
        with spied(live, cfg, f"{wl.name}-{target_name}"):
            wall, tokens, out = await driver.run()
        cpu, client_cpu, peak = sampler.cpu_s() - cpu0, time.process_time() - client0, sampler.peak()
        writes = sampler.writes() - writes0
        roles = by_role(live, groups0, sampler.cpu_by_group())
        write_roles = by_role(live, wgroups0, sampler.writes_by_group())
        if (pg_cpu := backends.cpu_s()) is not None:
            roles["postgres"] = pg_cpu
        await asyncio.sleep(cfg.after_seconds)
        rss_after = sampler.rss()
    finally:
        await sampler.stop()
        await driver.close()
    steps = ops.steps_of(wl, out["completed"])
    per = tokens if wl.kind == "stream" else steps
    return {**out, "cpu_by_role_s": {r: round(v, 3) for r, v in roles.items()},
            "cpu_ms_by_role": {r: round(1000 * v / per, 4) for r, v in roles.items()} if per else None,
            "wall_s": round(wall, 3), "tokens": tokens, "steps": steps, "cpu_s": round(cpu, 3),
            "cpu_ms_per_token": round(1000 * cpu / tokens, 4) if tokens else None,
            "cpu_ms_per_step": round(1000 * cpu / steps, 3) if steps else None,
            "write_calls": writes, "write_calls_per_token": round(writes / tokens, 3) if tokens else None,
            "write_calls_by_role": {r: int(v) for r, v in write_roles.items()},
            "client_cpu_s": round(client_cpu, 3) if live.child is None else None,
            "rss_before_mb": mb(rss_before), "rss_peak_mb": mb(peak), "rss_after_mb": mb(rss_after),
            "processes": len(sampler.cpu_by_pid)}


class _AnyAlive:
    """`harness.wait_ready` asks `poll()` whether the server died; here: whether any of the target's roots did."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.returncode = pids, None

    def poll(self) -> int | None:
        for pid in self.pids:
            if not Path(f"/proc/{pid}").exists():
                self.returncode = -1
                return -1
        return None


def one_cell(target: Target, wl: Workload, cfg: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    harness.log(f"  {wl.name:<34} {target.name:<18} ...")
    try:
        with started(target, wl, cfg, tmp) as live:
            cell = run_loop(measure(live, wl, cfg, target.name))
            if live.child is not None:
                live.child.stdin.write("exit\n")
                live.child.stdin.flush()
    except Exception as exc:  # noqa: BLE001 - reported, and the other cells go on
        cell = {"failed": f"{type(exc).__name__}: {exc}"[:500]}
    harness.log(f"    -> {summary_line(cell)}")
    return cell


def summary_line(c: dict[str, Any]) -> str:
    if c.get("failed"):
        return f"FAILED: {c['failed']}"
    err = f" errors={c['errors']} ({c['first_error']})" if c.get("errors") else ""
    return (f"wall {c['wall_s']:.2f}s  cpu {c['cpu_s']:.2f}s ({role_split(c)})  "
            f"rss {c['rss_before_mb']}/{c['rss_peak_mb']}/{c['rss_after_mb']} MB  "
            f"write calls {c.get('write_calls')}{write_split(c)}{err}")


def write_split(c: dict[str, Any]) -> str:
    """e.g. ` (api 9000 + worker 12000)`, when the target has more than one role."""
    roles = c.get("write_calls_by_role") or {}
    return " (" + " + ".join(f"{r} {v}" for r, v in roles.items()) + ")" if len(roles) > 1 else ""


def role_split(c: dict[str, Any]) -> str:
    """e.g. `api 1.20 + worker 2.31 s; postgres 0.40 s` (postgres is outside the server CPU column)."""
    roles = c.get("cpu_by_role_s") or {}
    own = " + ".join(f"{r} {v:.2f}" for r, v in roles.items() if r != "postgres") + " s"
    return own + (f"; postgres {roles['postgres']:.2f} s" if "postgres" in roles else "")


# --------------------------------------------------------------------------- floor child


def floor_child(spec: str) -> int:
    """Runs in the floor's own process: set up and warm, then wait for `go`, run, print the result, wait for `exit`."""
    wl = Workload(**json.loads(spec))

    async def main() -> None:
        f = ops.FloorOps()
        warm = ops.warm_variant(wl)
        await f.setup(warm)
        await ops.run(f, warm)
        await f.setup(wl)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        t0 = time.perf_counter()
        res, tokens = await ops.run(f, wl)
        wall = time.perf_counter() - t0
        print(json.dumps({"wall_s": wall, "tokens": tokens, "completed": res.completed, "errors": res.errors,
                          "first_error": res.first_error, "p50_s": harness.percentile(res.latencies, 50),
                          "max_s": max(res.latencies, default=None)}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)

    run_loop(main())
    return 0


# --------------------------------------------------------------------------- the run


def plan(cfg: argparse.Namespace) -> list[Target]:
    targets = []
    for kind in cfg.targets:
        targets.append(Target(kind, kind))
        if cfg.threadline_src and kind in ("embedded", *PG_TARGETS):
            targets.append(Target(f"{kind}@{Path(cfg.threadline_src).name}", kind, cfg.threadline_src))
    return targets


def order_for(targets: list[Target], index: int) -> list[Target]:
    """A/B pairs alternate: this checkout first on even workloads, the other checkout first on odd ones."""
    if index % 2 == 0:
        return targets
    out = list(targets)
    for i in range(len(out) - 1):
        if out[i].kind == out[i + 1].kind and out[i].src is None and out[i + 1].src is not None:
            out[i], out[i + 1] = out[i + 1], out[i]
    return out


def median_cell(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """With `--rounds` N: the round whose server CPU is the median (failed rounds left out), with every round's
    CPU by role beside it (`rounds_cpu_by_role_s`, sorted by server CPU)."""
    done = sorted((c for c in cells if not c.get("failed")), key=lambda c: c["cpu_s"])
    if len(cells) == 1 or not done:
        return cells[0]
    return {**done[(len(done) - 1) // 2], "rounds": len(cells), "rounds_failed": len(cells) - len(done),
            "rounds_cpu_by_role_s": [c["cpu_by_role_s"] for c in done]}


def ratios(rows: dict[str, dict[str, Any]]) -> None:
    for wl_rows in rows.values():
        floor = (wl_rows.get("floor") or {}).get("wall_s")
        ref = (wl_rows.get("reference") or {}).get("wall_s")
        for cell in wl_rows.values():
            if not cell.get("failed"):
                cell["over_floor"] = harness.ratio(cell["wall_s"], floor)
                cell["over_reference"] = harness.ratio(cell["wall_s"], ref)


def table(rows: dict[str, dict[str, Any]], targets: list[Target], skipped: dict[str, str]) -> str:
    f = harness.fmt
    head = ("| workload | target | wall s | x floor | x ref | server CPU s | CPU ms/token | CPU ms/step | "
            "CPU ms/unit by role | RSS before MB | RSS peak MB | RSS +after MB | client CPU s | err |")
    lines = [head, "|" + "|".join("---" for _ in range(head.count("|") - 1)) + "|"]
    for name, wl_rows in rows.items():
        for t in targets:
            c = wl_rows.get(t.name)
            if c is None:
                continue
            if c.get("failed"):
                lines.append(f"| {name} | {t.name} | FAILED: {c['failed'][:120]} |" + " |" * 11)
                continue
            lines.append(
                f"| {name} | {t.name} | {c['wall_s']:.2f} | {f(c.get('over_floor'), 2)} | "
                f"{f(c.get('over_reference'), 2)} | "
                f"{c['cpu_s']:.2f} | {f(c['cpu_ms_per_token'], 3)} | {f(c['cpu_ms_per_step'], 2)} | "
                f"{roles_cell(c)} | "
                f"{c['rss_before_mb']:.0f} | {c['rss_peak_mb']:.0f} | {c['rss_after_mb']:.0f} | "
                f"{f(c.get('client_cpu_s'), 2)} | {c['errors']} |")
    for t, why in skipped.items():
        lines.append(f"\n{t}: SKIPPED: {why}")
    return "\n".join(lines)


def roles_cell(c: dict[str, Any]) -> str:
    """CPU ms per token (or per step) of each role, when the target has more than one (pg: api / worker / postgres)."""
    per = c.get("cpu_ms_by_role") or {}
    if len(per) < 2:
        return ""
    return " / ".join(f"{r} {v:.3f}" if v < 1 else f"{r} {v:.2f}" for r, v in per.items())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="The quick profile (a few minutes).")
    p.add_argument("--targets", default=",".join(t for t in TARGETS if t not in ("pgonly", "pg1")),
                   help=f"Comma-separated, of {','.join(TARGETS)}.")
    p.add_argument("--only", default="",
                   help="Run only the workloads whose name contains one of these (comma-separated).")
    p.add_argument("--threadline-src", default=None, help="A checkout whose `threadline` package is measured too "
                   "(PYTHONPATH), as embedded@<dir> / pg@<dir>, alternated with this one.")
    p.add_argument("--reference-bin", default=None,
                   help="`langgraph` binary of LangGraph's server (default: as bench/run.py).")
    p.add_argument("--pg-workers", type=int, default=1,
                   help="`threadline worker` processes of the pg target (default 1).")
    p.add_argument("--threadline-arg", action="append", default=[], metavar="ARG",
                   help="Passed to `threadline serve` (embedded) and to the pg target's serve and worker processes, "
                        "e.g. --threadline-arg=--stream-buffer-events=100 (repeatable).")
    p.add_argument("--rounds", type=int, default=1,
                   help="Run each (workload, target) this many times, the order of an A/B's two sides swapped "
                        "from one round to the next; the table shows the round of median server CPU (default 1).")
    p.add_argument("--after-seconds", type=float, default=5.0, help="When RSS is read after the workload (default 5).")
    p.add_argument("--slow-ms", type=float, default=10.0,
                   help="The slow readers' pause after each event (default 10 ms).")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--startup-timeout", type=float, default=120.0)
    p.add_argument("--output", default=None, help="JSON path (default bench/results/workloads-<date>.json).")
    p.add_argument("--py-spy", default=None, metavar="DIR",
                   help="Record each server process (pg: the API and each worker) with py-spy while the measured "
                        "part runs (on-CPU samples, raw) into DIR; `pip install py-spy` first.")
    p.add_argument("--py-spy-arg", action="append", default=[], metavar="ARG",
                   help="Passed to `py-spy record` (repeatable): --py-spy-arg=--gil samples only the thread "
                        "holding the GIL (what runs Python; a thread waiting on a queue or the GIL is left out, "
                        "which py-spy's idle check alone misses).")
    p.add_argument("--collapse", default=None, metavar="FILE", help="Print a --py-spy file summed by function.")
    p.add_argument("--floor-child", default=None, help=argparse.SUPPRESS)
    scaleout.add_arguments(p)
    cfg = p.parse_args(argv)
    cfg.targets = [t.strip() for t in cfg.targets.split(",") if t.strip()]
    if bad := [t for t in cfg.targets if t not in TARGETS]:
        p.error(f"unknown targets {bad}")
    if cfg.threadline_src and not (Path(cfg.threadline_src) / "threadline" / "__init__.py").exists():
        p.error(f"--threadline-src {cfg.threadline_src}: no threadline/__init__.py there")
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.floor_child:
        return floor_child(cfg.floor_child)
    if cfg.collapse:
        collapse(cfg.collapse)
        return 0
    if cfg.py_spy:
        Path(cfg.py_spy).mkdir(parents=True, exist_ok=True)
    started_at = time.time()
    profile = "quick" if cfg.quick else "full"
    workloads = [replace(w, slow_ms=cfg.slow_ms) for w in PROFILES[profile]]
    if cfg.only:
        keys = [k.strip() for k in cfg.only.split(",") if k.strip()]
        workloads = [w for w in workloads if any(k in w.name for k in keys)]
    tl_bin = Path(sys.executable).parent / "threadline"
    cfg.tl_argv = [str(tl_bin)] if tl_bin.exists() else [sys.executable, "-m", "threadline"]
    # Absolute: the reference runs in a folder of its own.
    cfg.ref_bin = Path(cfg.reference_bin).absolute() if cfg.reference_bin else bench_run.find_reference_bin()
    cfg.logs_dir = harness.BENCH_DIR / "results"
    skipped: dict[str, str] = {}
    if "reference" in cfg.targets and (cfg.ref_bin is None or not cfg.ref_bin.exists()):
        skipped["reference"] = f"`langgraph dev` not installed; {bench_run.INSTALL_HINT}"
    for kind in PG_TARGETS:
        if kind in cfg.targets and (why := scaleout.check_services(cfg)):
            skipped[kind] = why
    targets = [t for t in plan(cfg) if t.kind not in skipped]
    cfg.imported_from = {t.name: threadline_file(cfg, t) for t in targets if t.kind in ("embedded", *PG_TARGETS)}
    for name, path in cfg.imported_from.items():
        harness.log(f"[{name}] threadline imported from {path}")
    for t, why in skipped.items():
        harness.log(f"[{t}] SKIPPED: {why}")
    harness.log(f"workloads ({profile}): {', '.join(w.name for w in workloads)}\n"
                f"targets: {', '.join(t.name for t in targets)}; {os.cpu_count()} CPUs")
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="threadline-workloads-") as tmp:
        for i, wl in enumerate(workloads):
            rounds: dict[str, list[dict[str, Any]]] = {}
            for r in range(cfg.rounds):
                harness.log(f"\n[{wl.name}]" + (f" round {r + 1}/{cfg.rounds}" if cfg.rounds > 1 else ""))
                for t in order_for(targets, i + r):
                    rounds.setdefault(t.name, []).append(one_cell(t, wl, cfg, Path(tmp)))
            rows[wl.name] = {name: median_cell(cells) for name, cells in rounds.items()}
    ratios(rows)
    text = table(rows, targets, skipped)
    harness.log("\n" + text)
    meta = {
        "command": " ".join(["python", *sys.argv]), "profile": profile,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        "duration_s": round(time.time() - started_at, 1), "python": sys.version.split()[0],
        "platform": platform.platform(), "cpu_count": os.cpu_count(), "load_avg_at_end": os.getloadavg(),
        "event_loop": event_loop_name(), "rounds": cfg.rounds, "pg_workers": cfg.pg_workers,
        "pg_slots": cfg.scaleout_slots,
        "threadline_src": cfg.threadline_src, "threadline_args": cfg.threadline_arg,
        "threadline_imported_from": cfg.imported_from, "reference_bin": str(cfg.ref_bin) if cfg.ref_bin else None,
        "versions": {d: bench_run.package_version(None, d) for d in ("threadline", "langgraph", "langchain-core")},
        "reference_langgraph_api": (bench_run.package_version(cfg.ref_bin.parent / "python", "langgraph-api")
                                    if cfg.ref_bin and cfg.ref_bin.exists() else None),
        "workloads": [asdict(w) for w in workloads], "targets": [asdict(t) for t in targets], "skipped": skipped,
    }
    day = time.strftime('%Y-%m-%d', time.gmtime())
    out = Path(cfg.output or harness.BENCH_DIR / "results" / f"workloads-{day}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": rows, "table": text}, indent=2) + "\n")
    harness.log(f"\nWrote {out} (total {meta['duration_s']}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
