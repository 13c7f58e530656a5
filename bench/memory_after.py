"""What a Threadline server still holds after long streamed runs, and why (issue 24: memory back down after).

Starts `threadline serve` on a fresh SQLite file with `bench/workloads_project` (the `chat` graph), runs
`--runs` concurrent runs of a `--tokens`-chunk reply in `--mode` (`POST /runs/wait` by default: the events are
produced and held the same way whether or not a client reads them; `--stream` reads them over SSE instead), and
reads the server's RSS:

* ``end``   - right after the runs;
* ``+5s``   - five seconds later, after one more small run (which lets the broker drop buffers past
              `--retain-seconds`);
* ``gc``    - after a full `gc.collect()` in the server;
* ``trim``  - after glibc's `malloc_trim(0)` in the server;

and the server's CPU seconds (user + system, from /proc) from the start of the runs to their end, per token.

The server gets the two last steps through signals (SIGUSR2: collect; SIGUSR1: trim) from a `sitecustomize`
this script writes to a temporary folder on the server's PYTHONPATH; `--retain-seconds` sets
`MemoryBroker.retain_seconds` there (default: the product's own, 600). Run it with the server's default
allocator and with `--malloc` (`PYTHONMALLOC=malloc`) to tell live data from memory the allocator keeps:

    python bench/memory_after.py                          # 8 x 16,000 tokens, messages-tuple
    python bench/memory_after.py --retain-seconds 2       # the finished runs' buffers dropped before `+5s`
    python bench/memory_after.py --malloc                 # glibc's allocator for everything (then `trim` tells)
    python bench/memory_after.py --mode values            # few events: the baseline
    PYTHONPATH=/tmp/other-checkout python bench/memory_after.py   # that checkout's `threadline` package
    python bench/memory_after.py --steps trim,gc          # what a malloc_trim alone gives back
    python bench/memory_after.py --why /tmp/why.jsonl     # what the server holds, and what holds its arenas
    python bench/memory_after.py --why /tmp/why.jsonl --why-frames 4   # + where it was allocated (very slow)

`--why FILE`: the server appends a JSON line to FILE before the runs and at `+5s` (on SIGHUP; that report
collects, so `gc` after it has nothing left to do): its RSS, the broker's held bytes, the collector's objects
by type, what a full collection finds unreachable (and how long it took), the small-object allocator's arenas
and allocated bytes (`sys._debugmallocstats`), the small objects in 1 MiB address ranges that held none before
the runs (what keeps those arenas), and with `--why-frames` tracemalloc's growth since `before` and garbage by
allocation site. `BENCH_GC_AT_END=1` in the environment: a full collection after every `end_stream` (an
experiment, see bench/README.md).

A measuring tool: no thresholds, numbers in bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parent
PROJECT = BENCH / "workloads_project"

SITECUSTOMIZE = '''
import ctypes, gc, os, signal
signal.signal(signal.SIGUSR1, lambda *_: ctypes.CDLL("libc.so.6").malloc_trim(0))
signal.signal(signal.SIGUSR2, lambda *_: gc.collect())
if os.environ.get("BENCH_RETAIN_SECONDS"):
    import threadline.broker.memory as memory
    memory.MemoryBroker.retain_seconds = float(os.environ["BENCH_RETAIN_SECONDS"])
if os.environ.get("BENCH_WHY"):  # every collection's time, by generation, for the report
    import time
    GC_TIMES = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
    _gc_started = [0.0]
    def _gc_timer(phase, info):
        if phase == "start":
            _gc_started[0] = time.perf_counter()
        else:
            GC_TIMES[info["generation"]][0] += 1
            GC_TIMES[info["generation"]][1] += time.perf_counter() - _gc_started[0]
    gc.callbacks.append(_gc_timer)
    import builtins
    builtins._bench_gc_times = GC_TIMES
if os.environ.get("BENCH_GC_AT_END"):  # an experiment: a full collection after each stream's end
    import threadline.broker.memory as memory
    _end = memory.MemoryBroker.end_stream
    async def _end_and_collect(self, run_id):
        await _end(self, run_id)
        gc.collect()
    memory.MemoryBroker.end_stream = _end_and_collect
if os.environ.get("BENCH_WHY"):
    def _why(*_):
        try:
            __import__("memory_why").report(os.environ["BENCH_WHY"])
        except Exception as exc:  # a report that failed says so, and the server goes on
            with open(os.environ["BENCH_WHY"], "a") as f:
                f.write(repr(exc) + "\\n")
    signal.signal(signal.SIGHUP, _why)
    import memory_why, threadline.broker.memory as memory  # the brokers made, for their counts (gc.freeze hides them)
    _init = memory.MemoryBroker.__init__
    def _remember(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        memory_why.BROKERS.append(self)
    memory.MemoryBroker.__init__ = _remember
'''

# `--why`: on SIGHUP the server appends to a JSON-lines file what it holds (a phase name is read from
# `<file>.phase`): its RSS, the broker's held bytes, the collector's view (objects by type, live and what a full
# collection finds unreachable), and with tracemalloc on (`--why-frames`), where the garbage and the growth
# since the `before` phase were allocated.
WHY = r'''
import asyncio, collections, gc, json, sys, time, tracemalloc
from pathlib import Path
_snaps = {}
BROKERS = []

def _rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024

def _types(objs, n=25):
    count, size = collections.Counter(), collections.Counter()
    for o in objs:
        t = type(o)
        name = f"{t.__module__}.{t.__qualname__}"
        count[name] += 1
        try:
            size[name] += sys.getsizeof(o)
        except Exception:
            pass
    return {"objects": sum(count.values()), "bytes": sum(size.values()),
            "top": [(k, count[k], size[k]) for k, _ in size.most_common(n)]}

def _diff(new, old, n=30):
    stats = new.compare_to(old, "traceback")
    out = []
    for st in stats[:n]:
        out.append({"kb": round(st.size_diff / 1024), "count": st.count_diff,
                    "where": [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in st.traceback]})
    return {"total_kb": round(sum(s.size_diff for s in stats) / 1024), "top": out}

def _deep(o, seen, depth=0):
    if id(o) in seen or depth > 6:
        return 0
    seen.add(id(o))
    size = sys.getsizeof(o)
    if isinstance(o, dict):
        for k, v in o.items():
            size += _deep(k, seen, depth + 1) + _deep(v, seen, depth + 1)
    elif isinstance(o, (list, tuple, set, frozenset)):
        for v in o:
            size += _deep(v, seen, depth + 1)
    elif hasattr(o, "__dict__") and not isinstance(o, type):
        size += _deep(vars(o), seen, depth + 1)
    return size

def _frame(f):
    local = {k: (type(v).__name__, _deep(v, set())) for k, v in f.f_locals.items()}
    return {"where": f"{f.f_code.co_filename.split('site-packages/')[-1]}:{f.f_lineno} {f.f_code.co_name}",
            "locals": local}

def _pymalloc():
    """What Python's small-object allocator holds (`sys._debugmallocstats`, which writes to fd 2), in kB."""
    import os, re, tempfile
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode()
    found = {}
    for name, pattern in (("arenas", r"# arenas allocated current\s*=\s*([\d,]+)"),
                          ("allocated_blocks_kb", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
                          ("available_blocks_kb", r"# bytes in available blocks\s*=\s*([\d,]+)"),
                          ("unused_pools_kb", r"# bytes in \d+ unused pools\s*=\s*([\d,]+)"),
                          ("total_kb", r"Total\s*=\s*([\d,]+)")):
        m = re.search(pattern, text)
        if m:
            value = int(m.group(1).replace(",", ""))
            found[name] = value if name == "arenas" else value // 1024
    return found

_buckets = set()

def _small(objs):
    """The objects and what they refer to that Python's small-object allocator holds (at most 512 bytes)."""
    seen = {}
    for o in objs:
        for x in (o, *gc.get_referents(o)):
            if sys.getsizeof(x) <= 512:
                seen[id(x)] = x
    return seen

def _pins(objs):
    """Small objects in 1 MiB address ranges that held none before the runs: what keeps the arenas made during
    them (by type, and the ranges they are in)."""
    fresh = {k: v for k, v in _small(objs).items() if k >> 20 not in _buckets}
    count = collections.Counter(f"{type(v).__module__}.{type(v).__qualname__}" for v in fresh.values())
    return {"ranges": len({k >> 20 for k in fresh}), "objects": len(fresh), "top": count.most_common(40)}

def report(path):
    phase = Path(path + ".phase").read_text().strip()
    out = {"phase": phase, "rss": _rss(), "t": time.time()}
    brokers = [b for b in BROKERS if b is not None]
    out["broker"] = [{"held": b.held_bytes, "streams": len(b._streams),
                      "packed": sum(type(s.events).__name__ == "_Packed" for s in b._streams.values())}
                     for b in brokers]
    loop = asyncio.events._get_running_loop()
    out["tasks"] = len(asyncio.all_tasks(loop)) if loop else None
    import builtins
    out["collections"] = {g: [n, round(t * 1000, 1)] for g, (n, t) in builtins._bench_gc_times.items()}
    out["pymalloc"] = _pymalloc()
    out["gc_count"] = gc.get_count()
    out["gens"] = [len(gc.get_objects(g)) for g in range(3)]
    tracing = tracemalloc.is_tracing()
    if tracing:
        _snaps[phase] = tracemalloc.take_snapshot()
    if phase == "before":
        _buckets.update(k >> 20 for k in _small(gc.get_objects()))
    else:
        gc.set_debug(gc.DEBUG_SAVEALL)
        # The young generations first (their garbage, kept), then a full collection, which also empties the
        # interpreter's free lists (tuples, lists, dicts, floats kept for reuse): what each gives back.
        gc.collect(1)
        young = len(gc.garbage)
        out["after_young"] = {"rss": _rss(), "pymalloc": _pymalloc(), "garbage": young}
        started = time.perf_counter()
        gc.collect()
        out["gc_ms"] = round((time.perf_counter() - started) * 1000, 2)
        gc.set_debug(0)
        garbage = list(gc.garbage)
        gc.garbage.clear()
        out["after_full_garbage_kept"] = {"rss": _rss(), "pymalloc": _pymalloc(), "garbage": len(garbage) - young}
        out["garbage"] = _types(garbage)
        out["garbage_frames"] = [_frame(o) for o in garbage if type(o).__name__ == "frame"]
        out["garbage_other"] = [repr(o)[:200] for o in garbage
                                if type(o).__name__ in ("Task", "CancelledError", "coroutine", "async_generator")]
        if tracing:
            held = tracemalloc.take_snapshot()
        del garbage
        gc.collect()
        out["rss_after_gc"] = _rss()
        out["pymalloc_after_gc"] = _pymalloc()
        import ctypes  # and what glibc's malloc_trim then gives back, and its time
        started = time.perf_counter()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        out["trim_ms"] = round((time.perf_counter() - started) * 1000, 2)
        out["rss_after_trim"] = _rss()
        if tracing:
            live = tracemalloc.take_snapshot()
            out["garbage_where"] = _diff(held, live)
            out["live_since_before"] = _diff(live, _snaps["before"])
    out["live"] = _types(gc.get_objects())
    if phase != "before":
        out["pins"] = _pins(gc.get_objects())
    with open(path, "a") as f:
        f.write(json.dumps(out) + chr(10))
'''


def cpu_seconds(pid: int) -> float:
    """The server's user + system CPU seconds so far (all its threads)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return -1


async def one_run(client: httpx.AsyncClient, tokens: int, mode: str, stream: bool) -> None:
    body = {"assistant_id": "chat", "input": {"messages": [{"role": "user", "content": "hi"}]},
            "config": {"configurable": {"reply_tokens": tokens}}, "stream_mode": [mode]}
    if not stream:
        (await client.post("/runs/wait", json=body)).raise_for_status()
        return
    async with client.stream("POST", "/runs/stream", json=body) as response:
        response.raise_for_status()
        async for _ in response.aiter_raw():
            pass


def server_env(cfg: argparse.Namespace, folder: Path, base: dict[str, str]) -> dict[str, str]:
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (folder / "memory_why.py").write_text(WHY)
    # Its own folder first, then a PYTHONPATH given (another checkout's `threadline`, for an A/B).
    env = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
    if cfg.retain_seconds is not None:
        env["BENCH_RETAIN_SECONDS"] = str(cfg.retain_seconds)
    if cfg.malloc:
        env["PYTHONMALLOC"] = "malloc"
    if cfg.why:
        env["BENCH_WHY"] = str(Path(cfg.why).resolve())
        if cfg.why_frames:
            env["PYTHONTRACEMALLOC"] = str(cfg.why_frames)
    return env


@contextlib.contextmanager
def started(cfg: argparse.Namespace, folder: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """The server processes by role: `server` (embedded, SQLite), or `api` and `worker` (`--stack pg`: a fresh
    PostgreSQL database and Redis key prefix, both gone after)."""
    if cfg.stack == "embedded":
        server = subprocess.Popen(
            [sys.executable, "-m", "threadline", "serve", "--config", str(PROJECT / "langgraph.json"), "--port",
             str(cfg.port), "--database-url", f"sqlite:///{folder}/bench.db", "--log-level", "warning"],
            env=server_env(cfg, folder, dict(os.environ)), cwd=folder, stdout=subprocess.DEVNULL)
        try:
            yield {"server": server}
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        return
    import scaleout  # the scale-out cells' database, Redis prefix and processes

    token = uuid.uuid4().hex[:10]
    dbname, prefix = f"threadline_bench_{token}", f"tlbench-{token}"
    db_url = scaleout.database_url(scaleout.DEFAULT_PG_ADMIN_URL, dbname)
    env = server_env(cfg, folder, scaleout.clean_env(dict(os.environ), db_url, scaleout.DEFAULT_REDIS_URL, prefix))
    env["THREADLINE_CONFIG"] = str(PROJECT / "langgraph.json")
    procs = scaleout.Procs()
    scaleout.create_database(scaleout.DEFAULT_PG_ADMIN_URL, dbname)
    try:
        tl = [sys.executable, "-m", "threadline"]
        subprocess.run([*tl, "migrate"], env=env, check=True, capture_output=True, timeout=120)
        worker = procs.start("worker", [*tl, "worker"], env, folder / "worker.log")
        api = procs.start("api", [*tl, "serve", "--host", "127.0.0.1", "--port", str(cfg.port), "--workers", "0"],
                          env, folder / "api.log")
        asyncio.run(scaleout.wait_workers([(worker, folder / "worker.log")], 120))
        yield {"api": api, "worker": worker}
    finally:
        procs.stop_all()
        scaleout.drop_database(scaleout.DEFAULT_PG_ADMIN_URL, dbname)
        scaleout.delete_redis_keys(scaleout.DEFAULT_REDIS_URL, prefix)


def rss_all(servers: dict[str, subprocess.Popen[bytes]]) -> str:
    """RSS in MB: one process's, or the sum and each role's (`api 120 + worker 140`)."""
    each = {role: rss_mb(p.pid) for role, p in servers.items()}
    total = sum(each.values())
    return str(total) if len(each) == 1 else f"{total} ({' + '.join(f'{r} {v}' for r, v in each.items())})"


async def measure(cfg: argparse.Namespace, servers: dict[str, subprocess.Popen[bytes]]) -> dict[str, str]:
    server = servers.get(cfg.why_role) or next(iter(servers.values()))  # the one `--why` asks
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{cfg.port}", timeout=cfg.timeout) as client:
        deadline = time.monotonic() + 120
        while True:
            try:
                if (await client.get("/ok")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in servers.values()):
                raise SystemExit("the server did not start")
            await asyncio.sleep(0.2)
        await one_run(client, 20, cfg.mode, cfg.stream)  # warm: every import and first-use cache
        await why(cfg, server, "before")
        out = {"before": rss_all(servers)}
        cpu = {role: cpu_seconds(p.pid) for role, p in servers.items()}
        await asyncio.gather(*(one_run(client, cfg.tokens, cfg.mode, cfg.stream) for _ in range(cfg.runs)))
        out["end"] = rss_all(servers)
        cfg.cpu_by_role = {role: cpu_seconds(p.pid) - cpu[role] for role, p in servers.items()}
        cfg.cpu = sum(cfg.cpu_by_role.values())
        await asyncio.sleep(5)
        await one_run(client, 20, cfg.mode, cfg.stream)
        await asyncio.sleep(0.5)
        out["+5s"] = rss_all(servers)
        await why(cfg, server, "after")
        for name in cfg.steps.split(","):
            for p in servers.values():
                p.send_signal({"gc": signal.SIGUSR2, "trim": signal.SIGUSR1}[name])
            await asyncio.sleep(1.5)
            out[name] = rss_all(servers)
        return out


async def why(cfg: argparse.Namespace, server: subprocess.Popen[bytes], phase: str) -> None:
    """With `--why`: the server appends its report for `phase` to the file (and takes its time to)."""
    if cfg.why:
        await asyncio.to_thread(_why_report, Path(cfg.why), server, phase)


def _why_report(path: Path, server: subprocess.Popen[bytes], phase: str) -> None:
    lines = len(path.read_text().splitlines()) if path.exists() else 0
    Path(f"{path.resolve()}.phase").write_text(phase)
    server.send_signal(signal.SIGHUP)
    while not path.exists() or len(path.read_text().splitlines()) == lines:
        time.sleep(0.5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16000)
    p.add_argument("--mode", default="messages-tuple")
    p.add_argument("--stream", action="store_true", help="Read each run over SSE (default: POST /runs/wait).")
    p.add_argument("--retain-seconds", type=float, default=None)
    p.add_argument("--malloc", action="store_true", help="PYTHONMALLOC=malloc in the server.")
    p.add_argument("--steps", default="gc,trim", help="The last steps, in order (`trim,gc`: what a malloc_trim "
                   "alone gives back).")
    p.add_argument("--why", default=None, help="A JSON-lines file the server writes what it holds to, before the "
                   "runs and at +5s (objects by type, live and garbage); the +5s report collects, so gc is after.")
    p.add_argument("--why-frames", type=int, default=0,
                   help="With --why: tracemalloc in the server with this many frames (slow): where it was allocated.")
    p.add_argument("--stack", choices=["embedded", "pg"], default="embedded",
                   help="pg: `threadline serve --workers 0` and one `threadline worker` on PostgreSQL + Redis "
                   "(127.0.0.1, as bench/scaleout.py); their RSS summed, each shown.")
    p.add_argument("--why-role", default="worker", help="--stack pg: the process --why asks (api or worker).")
    p.add_argument("--port", type=int, default=48300)
    p.add_argument("--timeout", type=float, default=900)
    cfg = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, started(cfg, Path(tmp)) as servers:
        out = asyncio.run(measure(cfg, servers))
    setup = (f"{cfg.stack}, {cfg.runs} x {cfg.tokens} tokens, {cfg.mode}, {'SSE' if cfg.stream else '/runs/wait'}, "
             f"retain {cfg.retain_seconds if cfg.retain_seconds is not None else 'default'}, "
             f"{'malloc' if cfg.malloc else 'pymalloc'}")
    print(f"{setup}: " + ", ".join(f"{k} {v} MB" for k, v in out.items())
          + f"; server CPU for the runs {cfg.cpu:.2f} s, {cfg.cpu / (cfg.runs * cfg.tokens) * 1e6:.0f} us/token"
          + ("" if len(cfg.cpu_by_role) == 1 else
             " (" + " + ".join(f"{r} {v:.2f} s" for r, v in cfg.cpu_by_role.items()) + ")"))


if __name__ == "__main__":
    main()
