#!/usr/bin/env python
"""Threadline benchmark: one command, three columns, same graph, same run.

    python bench/run.py            # default run (a few minutes)
    python bench/run.py --quick    # smaller run (about a minute)

Columns:

* ``floor``      - the graph in-process (``graph.ainvoke`` / ``graph.astream``
                   with an ``InMemorySaver`` and a fresh thread id per call);
* ``threadline`` - ``threadline serve`` as a subprocess on a fresh temp SQLite db;
* ``reference``  - ``langgraph dev`` (LangGraph Platform's dev server), if it is
                   installed; otherwise the column is skipped with a hint.

Cells (per server): ``POST /runs/wait`` (stateless) and
``POST /threads/{id}/runs/wait`` (a distinct, pre-created thread per request) at
each concurrency, then time-to-first-token on ``POST /runs/stream`` with
``stream_mode=messages-tuple``, and the client's null round trip (``GET /ok``,
sequential). Servers run one at a time, never concurrently.
Then the scale-out cells (``bench/scaleout.py``): ``POST /threads/{id}/runs/wait`` on
PostgreSQL + Redis with one API process and 1, 2 and 4 worker processes.

Every measured request goes through one ``aiohttp.ClientSession`` per server column
(or scale-out cell), built by ``client_session``: httpx's async client costs about
2 ms more per request on this kind of machine, which would be counted as server
overhead. Untimed helpers (``GET /ok`` polling at startup) use httpx.

Results are printed as tables and written to ``bench/results/latest.json``.
See ``bench/README.md`` for how to read the ratios. There are no timing
assertions here; this is a measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import scaleout  # the scale-out cells (PostgreSQL + Redis, 1 API + N worker processes); see bench/scaleout.py

# What this script shares with scaleout.py (cells, servers, the measuring client, formatting); see bench/harness.py.
from harness import (
    BENCH_DIR,
    GRAPH_ID,
    PROJECT_DIR,
    REPO_ROOT,
    RUN_INPUT,
    CellFailed,
    Reply,
    ServerFailed,
    check_values,
    client_session,
    failed_cell,
    fetch,
    fmt,
    fmt_cell,
    free_port,
    log,
    ms,
    percentile,
    raise_for,
    ratio,
    run_cell,
    server_process,
    tail,
    wait_ready,
)

from threadline.cli import event_loop_name, run_loop  # the bench runs in the venv it launches threadline from

NULL_RTT_SAMPLES = 200  # sequential GET /ok per server column: the client's own round trip
INSTALL_HINT = (
    'python -m venv .refvenv && .refvenv/bin/pip install "langgraph-cli[inmem]"\n'
    "  (then re-run, or point BENCH_REFERENCE_BIN at the venv's `langgraph` binary)"
)

# --------------------------------------------------------------------------- stats


async def run_ttft(
    op: Callable[[int], Awaitable[tuple[float, float]]], n: int, time_limit_s: float
) -> dict[str, Any]:
    """Sequential (concurrency 1) streams; `op` returns (ttft_s, total_s)."""
    ttfts: list[float] = []
    totals: list[float] = []
    errors = 0
    first_error: str | None = None
    stop_at = time.perf_counter() + time_limit_s
    for i in range(n):
        if time.perf_counter() > stop_at:
            break
        try:
            ttft, total = await op(i)
        except Exception as exc:  # noqa: BLE001
            errors += 1
            if first_error is None:
                first_error = f"{type(exc).__name__}: {exc}"[:500]
            continue
        ttfts.append(ttft)
        totals.append(total)
    return {
        "requested": n,
        "completed": len(ttfts),
        "errors": errors,
        "ttft_p50_ms": ms(percentile(ttfts, 50)),
        "ttft_p90_ms": ms(percentile(ttfts, 90)),
        "ttft_p99_ms": ms(percentile(ttfts, 99)),
        "stream_total_p50_ms": ms(percentile(totals, 50)),
        "first_error": first_error,
    }


# --------------------------------------------------------------------------- floor


def load_graph_module() -> Any:
    spec = importlib.util.spec_from_file_location("threadline_bench_graph", PROJECT_DIR / "graph.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # Registered first: StateGraph resolves the TypedDict's annotations via sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def floor_graph() -> Any:
    from langgraph.checkpoint.memory import InMemorySaver

    return load_graph_module().build().compile(checkpointer=InMemorySaver())


def floor_config() -> dict[str, Any]:
    return {"configurable": {"thread_id": str(uuid.uuid4())}}


async def bench_floor(cfg: argparse.Namespace) -> dict[str, Any]:
    graph = floor_graph()
    config = floor_config

    async def invoke(_: int) -> None:
        check_values(await graph.ainvoke(RUN_INPUT, config()))

    async def stream(_: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        first = None
        async for _chunk in graph.astream(RUN_INPUT, config(), stream_mode="messages"):
            if first is None:
                first = time.perf_counter() - t0
        if first is None:
            raise RuntimeError("no messages chunk streamed")
        return first, time.perf_counter() - t0

    await run_cell(invoke, cfg.warmup, 1, cfg.cell_seconds)
    await run_cell(stream, cfg.warmup, 1, cfg.cell_seconds)
    cells = {}
    for c in cfg.concurrency:
        res = await run_cell(invoke, cfg.n_for(c), c, cfg.cell_seconds)
        cells[str(c)] = res.summary()
        log(f"  floor      ainvoke    c={c:<3} {fmt_cell(cells[str(c)])}")
    ttft = await run_ttft(stream, cfg.ttft_samples, cfg.cell_seconds)
    log(f"  floor      astream    ttft p50={fmt(ttft['ttft_p50_ms'])} ms")
    # The in-process floor has no separate stateless/thread path: both compare to it.
    return {"wait": {"stateless": cells, "thread": cells}, "ttft": ttft}


# --------------------------------------------------------------------------- server columns


async def bench_http(name: str, base_url: str, proc: subprocess.Popen, cfg: argparse.Namespace) -> dict[str, Any]:
    ready_s = await wait_ready(base_url, proc, cfg.startup_timeout)
    log(f"  {name}: /ok after {ready_s:.1f}s")
    max_c = max(cfg.concurrency)
    body = {"assistant_id": GRAPH_ID, "input": RUN_INPUT}
    stream_body = {**body, "stream_mode": ["messages-tuple"]}

    floor = floor_graph()

    async def floor_run() -> None:  # paired with each request of the c=1 cells
        check_values(await floor.ainvoke(RUN_INPUT, floor_config()))

    async with client_session(base_url, max_c, cfg.request_timeout) as client:

        async def null_rtt(_: int) -> None:
            r = await fetch(client, "GET", "/ok")
            raise_for(r, "GET /ok")

        async def stateless_wait(_: int) -> None:
            r = await fetch(client, "POST", "/runs/wait", json_body=body)
            raise_for(r, "POST /runs/wait")
            check_values(r.json())

        setup_errors: list[str] = []

        async def create_threads(count: int) -> list[str]:
            """Pre-create `count` threads (untimed). A failed create is retried up to
            3 times; the first failure is kept in `setup_errors` for the report."""
            ids: list[str] = [""] * count

            async def make(i: int) -> None:
                for attempt in range(4):
                    r = await fetch(client, "POST", "/threads", json_body={})
                    if r.status_code < 300:
                        ids[i] = r.json()["thread_id"]
                        return
                    if len(setup_errors) < 5:
                        setup_errors.append(f"POST /threads {{}} -> HTTP {r.status_code}: {r.text[:300]}")
                    await asyncio.sleep(0.05 * (attempt + 1))
                raise_for(r, "POST /threads")

            res = await run_cell(make, count, min(8, max_c), cfg.request_timeout * 2)
            if res.errors or res.completed < count:
                raise CellFailed(f"creating threads failed: {res.first_error or 'time limit'}")
            return ids

        def thread_wait_op(thread_ids: list[str]) -> Callable[[int], Awaitable[None]]:
            async def op(i: int) -> None:
                r = await fetch(client, "POST", f"/threads/{thread_ids[i]}/runs/wait", json_body=body)
                raise_for(r, "POST /threads/{id}/runs/wait")
                check_values(r.json())

            return op

        async def stream_ttft(_: int) -> tuple[float, float]:
            t0 = time.perf_counter()
            first = None
            event = None
            async with client.post("/runs/stream", json=stream_body) as resp:
                if resp.status >= 300:
                    raise_for(Reply(resp.status, await resp.read()), "POST /runs/stream")
                async for raw in resp.content:  # one line per item, as it arrives (b"...\r\n" or b"...\n")
                    if raw.startswith(b"event:"):
                        event = raw[len(b"event:"):].decode("utf-8", errors="replace").strip()
                        if event == "error":
                            raise RuntimeError("stream emitted an error event")
                        if first is None and event == "messages":
                            first = time.perf_counter() - t0
            if first is None:
                raise RuntimeError("stream ended without a `messages` event")
            return first, time.perf_counter() - t0

        # Warm-up: every path once or more, not measured.
        warm = [
            await run_cell(stateless_wait, cfg.warmup, min(4, max_c), cfg.cell_seconds),
            await run_cell(thread_wait_op(await create_threads(cfg.warmup)), cfg.warmup, min(4, max_c),
                           cfg.cell_seconds),
            await run_cell(lambda i: stream_ttft(i), max(2, cfg.warmup // 4), 1, cfg.cell_seconds),
            await run_cell(null_rtt, cfg.warmup, 1, cfg.cell_seconds),
            await run_cell(lambda _: floor_run(), cfg.warmup, 1, cfg.cell_seconds),
        ]
        for w in warm:
            if w.completed == 0:
                raise ServerFailed(f"warm-up failed: {w.first_error}")

        out: dict[str, Any] = {"ready_after_s": round(ready_s, 2), "wait": {"stateless": {}, "thread": {}}}
        # The client's own round trip on this server (HTTP + the client, next to no server work).
        res = await run_cell(null_rtt, NULL_RTT_SAMPLES, 1, cfg.cell_seconds)
        out["null_rtt"] = {"endpoint": "GET /ok", **res.summary()}
        out["null_rtt_ms"] = out["null_rtt"]["p50_ms"]
        log(f"  {name:<10} GET /ok    c=1   {fmt_cell(out['null_rtt'])}  (client null round trip)")
        for c in cfg.concurrency:
            n = cfg.n_for(c)
            res = await run_cell(stateless_wait, n, c, cfg.cell_seconds, paired=floor_run if c == 1 else None)
            out["wait"]["stateless"][str(c)] = res.summary()
            log(f"  {name:<10} stateless  c={c:<3} {fmt_cell(out['wait']['stateless'][str(c)])}")
        for c in cfg.concurrency:
            n = cfg.n_for(c)
            try:
                thread_ids = await create_threads(n)  # not timed
            except CellFailed as exc:
                out["wait"]["thread"][str(c)] = failed_cell(n, c, str(exc))
                log(f"  {name:<10} thread     c={c:<3} FAILED: {exc}")
                continue
            res = await run_cell(thread_wait_op(thread_ids), n, c, cfg.cell_seconds,
                                 paired=floor_run if c == 1 else None)
            out["wait"]["thread"][str(c)] = res.summary()
            log(f"  {name:<10} thread     c={c:<3} {fmt_cell(out['wait']['thread'][str(c)])}")
        out["ttft"] = await run_ttft(stream_ttft, cfg.ttft_samples, cfg.cell_seconds)
        log(f"  {name:<10} stream     ttft p50={fmt(out['ttft']['ttft_p50_ms'])} ms")
        if setup_errors:
            out["setup_errors"] = setup_errors
            log(f"  {name:<10} setup errors (untimed thread creation, retried): {len(setup_errors)} kept, "
                f"first: {setup_errors[0]}")
    if proc.poll() is not None:
        raise ServerFailed(f"server exited with code {proc.returncode} during the run")
    return out


def run_server_column(name: str, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path,
                      cfg: argparse.Namespace) -> dict[str, Any]:
    log(f"\n[{name}] {' '.join(argv)}")
    with server_process(name, argv, cwd, env, log_path) as proc:
        base_url = argv_url(argv)
        try:
            out = run_loop(bench_http(name, base_url, proc, cfg))
        except Exception as exc:  # noqa: BLE001 - report and carry on with the other columns
            log(f"  {name}: FAILED: {type(exc).__name__}: {exc}\n  --- last lines of {log_path} ---\n{tail(log_path)}")
            return {"skipped": f"failed: {type(exc).__name__}: {exc}", "log": str(log_path)}
        out["log"] = str(log_path)
        return out


def argv_url(argv: list[str]) -> str:
    return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"


def find_reference_bin() -> Path | None:
    candidates: list[Path] = []
    if os.environ.get("BENCH_REFERENCE_BIN"):
        candidates.append(Path(os.environ["BENCH_REFERENCE_BIN"]).expanduser())
    candidates += [REPO_ROOT / ".refvenv" / "bin" / "langgraph", REPO_ROOT / ".venv-ref" / "bin" / "langgraph"]
    which = shutil.which("langgraph")
    if which:
        candidates.append(Path(which))
    for cand in candidates:
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def package_version(python: Path | None, dist: str) -> str | None:
    if python is None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None
    try:
        out = subprocess.run(
            [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# --------------------------------------------------------------------------- output


def diff(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return round(a - b, 3)


def compute_ratios(results: dict[str, Any], cfg: argparse.Namespace) -> dict[str, Any]:
    def cell(col: str, kind: str, c: int) -> dict[str, Any]:
        data = results.get(col) or {}
        return ((data.get("wait") or {}).get(kind) or {}).get(str(c)) or {}

    wait: dict[str, Any] = {}
    for kind in ("stateless", "thread"):
        wait[kind] = {}
        for c in cfg.concurrency:
            tl, ref, fl = cell("threadline", kind, c), cell("reference", kind, c), cell("floor", kind, c)
            # The overhead over the floor at c=1 is taken against the floor runs paired with that cell's
            # requests (`run_cell(paired=...)`); elsewhere against the floor column, measured on its own.
            wait[kind][str(c)] = {
                "threadline_over_reference_runs_per_s": ratio(tl.get("runs_per_s"), ref.get("runs_per_s")),
                "threadline_over_reference_p50": ratio(tl.get("p50_ms"), ref.get("p50_ms")),
                "threadline_over_reference_p99": ratio(tl.get("p99_ms"), ref.get("p99_ms")),
                "threadline_p50_overhead_over_floor_ms": diff(tl.get("p50_ms"),
                                                              tl.get("paired_floor_p50_ms", fl.get("p50_ms"))),
                "reference_p50_overhead_over_floor_ms": diff(ref.get("p50_ms"),
                                                             ref.get("paired_floor_p50_ms", fl.get("p50_ms"))),
                "threadline_paired_floor_p50_ms": tl.get("paired_floor_p50_ms"),
                "reference_paired_floor_p50_ms": ref.get("paired_floor_p50_ms"),
                "threadline_p50_overhead_over_floor_alone_ms": diff(tl.get("p50_ms"), fl.get("p50_ms")),
                "reference_p50_overhead_over_floor_alone_ms": diff(ref.get("p50_ms"), fl.get("p50_ms")),
                "threadline_over_floor_runs_per_s": ratio(tl.get("runs_per_s"), fl.get("runs_per_s")),
                "reference_over_floor_runs_per_s": ratio(ref.get("runs_per_s"), fl.get("runs_per_s")),
            }

    def ttft(col: str) -> float | None:
        return ((results.get(col) or {}).get("ttft") or {}).get("ttft_p50_ms")

    def null_rtt(col: str) -> float | None:
        return (results.get(col) or {}).get("null_rtt_ms")

    return {
        "wait": wait,
        "null_rtt_ms": {"threadline": null_rtt("threadline"), "reference": null_rtt("reference")},
        "ttft": {
            "threadline_over_reference_p50": ratio(ttft("threadline"), ttft("reference")),
            "threadline_p50_overhead_over_floor_ms": diff(ttft("threadline"), ttft("floor")),
            "reference_p50_overhead_over_floor_ms": diff(ttft("reference"), ttft("floor")),
        },
    }


def render_tables(results: dict[str, Any], ratios: dict[str, Any], cfg: argparse.Namespace) -> str:
    lines: list[str] = []
    cols = ["floor", "threadline", "reference"]
    skipped = {c: (results.get(c) or {}).get("skipped") for c in cols}

    lines.append("Absolute numbers (latency in ms; runs/s = completed / wall time of the cell)")
    hdr = f"{'column':<11}{'endpoint':<34}{'c':>4}{'n':>6}{'err':>5}{'runs/s':>10}{'p50':>9}{'p99':>9}"
    lines.append(hdr)
    lines.append("-" * len(hdr))
    endpoints = {
        "floor": {"stateless": "graph.ainvoke (in-process)"},
        "threadline": {"stateless": "POST /runs/wait", "thread": "POST /threads/{id}/runs/wait"},
        "reference": {"stateless": "POST /runs/wait", "thread": "POST /threads/{id}/runs/wait"},
    }
    for col in cols:
        if skipped[col]:
            lines.append(f"{col:<11}SKIPPED: {skipped[col]}")
            continue
        for kind, label in endpoints[col].items():
            for c in cfg.concurrency:
                s = results[col]["wait"][kind].get(str(c))
                if not s:
                    continue
                if s.get("failed"):
                    lines.append(f"{col:<11}{label:<34}{c:>4}  FAILED (see errors below)")
                    continue
                flag = "*" if s["truncated_by_time_limit"] else ""
                lines.append(
                    f"{col:<11}{label:<34}{c:>4}{str(s['completed']) + flag:>6}{s['errors']:>5}"
                    f"{fmt(s['runs_per_s']):>10}{fmt(s['p50_ms'], 2):>9}{fmt(s['p99_ms'], 2):>9}"
                )
    lines.append("  (* = cell stopped early by --cell-seconds; fewer requests than asked)")

    lines.append("")
    lines.append("Ratios  (TL = threadline, ref = reference langgraph dev, floor = in-process ainvoke)")
    hdr = (
        f"{'endpoint':<11}{'c':>4}{'TL/ref runs/s':>15}{'TL/ref p50':>12}{'TL/ref p99':>12}"
        f"{'TL-floor p50 ms':>17}{'ref-floor p50 ms':>18}{'TL/floor runs/s':>17}"
    )
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for kind in ("stateless", "thread"):
        for c in cfg.concurrency:
            r = ratios["wait"][kind][str(c)]
            lines.append(
                f"{kind:<11}{c:>4}{fmt(r['threadline_over_reference_runs_per_s'], 2):>15}"
                f"{fmt(r['threadline_over_reference_p50'], 2):>12}{fmt(r['threadline_over_reference_p99'], 2):>12}"
                f"{fmt(r['threadline_p50_overhead_over_floor_ms'], 2):>17}"
                f"{fmt(r['reference_p50_overhead_over_floor_ms'], 2):>18}"
                f"{fmt(r['threadline_over_floor_runs_per_s'], 3):>17}"
            )
    lines.append("  TL/ref runs/s > 1: threadline has more throughput; TL/ref p50 < 1: threadline is faster.")
    lines.append("  c=1 `-floor p50 ms`: against the floor run in-process right after each request of that cell "
                 "(paired; the floor column's own cell is measured alone, before the servers).")
    for kind in ("stateless", "thread"):
        r = ratios["wait"][kind].get("1") or {}
        if r.get("threadline_paired_floor_p50_ms") is not None or r.get("reference_paired_floor_p50_ms") is not None:
            lines.append(f"  {kind} c=1: paired floor p50 "
                         f"{fmt(r.get('threadline_paired_floor_p50_ms'), 2)} ms (TL cell), "
                         f"{fmt(r.get('reference_paired_floor_p50_ms'), 2)} ms (ref cell); against the floor column "
                         f"instead: TL-floor {fmt(r.get('threadline_p50_overhead_over_floor_alone_ms'), 2)} ms, "
                         f"ref-floor {fmt(r.get('reference_p50_overhead_over_floor_alone_ms'), 2)} ms")
    rtt = ratios.get("null_rtt_ms") or {}

    def rtt_ms(col: str) -> str:
        return "-" if rtt.get(col) is None else f"{rtt[col]:.2f} ms"

    lines.append(
        f"client null round trip (GET /ok p50): threadline {rtt_ms('threadline')}, reference {rtt_ms('reference')}"
    )

    lines.append("")
    lines.append("Time to first streamed token (POST /runs/stream, stream_mode=messages-tuple, c=1)")
    hdr = f"{'column':<11}{'n':>6}{'err':>5}{'ttft p50':>10}{'ttft p99':>10}{'stream total p50':>18}"
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for col in cols:
        if skipped[col]:
            lines.append(f"{col:<11}SKIPPED")
            continue
        t = results[col]["ttft"]
        lines.append(
            f"{col:<11}{t['completed']:>6}{t['errors']:>5}{fmt(t['ttft_p50_ms'], 2):>10}"
            f"{fmt(t['ttft_p99_ms'], 2):>10}{fmt(t['stream_total_p50_ms'], 2):>18}"
        )
    tr = ratios["ttft"]
    lines.append(
        f"TTFT p50: TL/ref = {fmt(tr['threadline_over_reference_p50'], 2)}   "
        f"TL - floor = {fmt(tr['threadline_p50_overhead_over_floor_ms'], 2)} ms   "
        f"ref - floor = {fmt(tr['reference_p50_overhead_over_floor_ms'], 2)} ms"
    )

    errs = []
    for col in cols:
        data = results.get(col) or {}
        for kind, cells in (data.get("wait") or {}).items():
            for c, s in cells.items():
                if s.get("first_error"):
                    errs.append(f"  {col} {kind} c={c}: {s['first_error']}")
        if (data.get("ttft") or {}).get("first_error"):
            errs.append(f"  {col} ttft: {data['ttft']['first_error']}")
        if (data.get("null_rtt") or {}).get("first_error"):
            errs.append(f"  {col} null round trip (GET /ok): {data['null_rtt']['first_error']}")
        for e in data.get("setup_errors") or []:
            errs.append(f"  {col} setup (thread creation, retried): {e}")
    if errs:
        lines.append("")
        lines.append("First error per cell:")
        lines.extend(dict.fromkeys(errs))
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="Small run: n=40 at c=1, 100 at c>1, 15 TTFT samples.")
    p.add_argument("--concurrency", default="1,8,32", help="Comma-separated concurrencies (default 1,8,32).")
    p.add_argument("--n1", type=int, default=None, help="Requests per cell at c=1 (default 200; quick 40).")
    p.add_argument("--n", type=int, default=None, help="Requests per cell at c>1 (default 400; quick 100).")
    p.add_argument("--ttft-samples", type=int, default=None, help="Sequential streams for TTFT (default 50; quick 15).")
    p.add_argument("--warmup", type=int, default=None, help="Warm-up requests per path (default 20; quick 8).")
    p.add_argument("--cell-seconds", type=float, default=None,
                   help="Stop starting new requests in a cell after this many seconds (default 20; quick 10).")
    p.add_argument("--request-timeout", type=float, default=60.0, help="Per-request timeout in seconds.")
    p.add_argument("--startup-timeout", type=float, default=90.0, help="Seconds to wait for GET /ok.")
    p.add_argument("--workers", type=int, default=None,
                   help="Pass --workers to threadline serve (default: threadline's own default).")
    p.add_argument("--reference-bin", default=None, help="Path to the reference `langgraph` binary "
                   "(default: $BENCH_REFERENCE_BIN, .refvenv/bin/langgraph, .venv-ref/bin/langgraph, PATH).")
    p.add_argument("--skip", default="", help="Comma-separated parts to skip: floor,threadline,reference,scaleout.")
    scaleout.add_arguments(p)
    p.add_argument("--output", default=str(BENCH_DIR / "results" / "latest.json"), help="JSON results path.")
    cfg = p.parse_args(argv)
    cfg.concurrency = [int(x) for x in cfg.concurrency.split(",") if x.strip()]
    if not cfg.concurrency or min(cfg.concurrency) < 1:
        p.error("--concurrency needs positive integers")
    quick = cfg.quick
    cfg.n1 = cfg.n1 if cfg.n1 is not None else (40 if quick else 200)
    cfg.n = cfg.n if cfg.n is not None else (100 if quick else 400)
    cfg.ttft_samples = cfg.ttft_samples if cfg.ttft_samples is not None else (15 if quick else 50)
    cfg.warmup = cfg.warmup if cfg.warmup is not None else (8 if quick else 20)
    cfg.cell_seconds = cfg.cell_seconds if cfg.cell_seconds is not None else (10.0 if quick else 20.0)
    for name in ("n1", "n", "ttft_samples", "warmup"):
        if getattr(cfg, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    cfg.n_for = lambda c: cfg.n1 if c == 1 else cfg.n
    cfg.skip = {s.strip() for s in cfg.skip.split(",") if s.strip()}
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    started = time.time()
    results: dict[str, Any] = {}
    log(f"Threadline bench: concurrency={cfg.concurrency} n(c=1)={cfg.n1} n(c>1)={cfg.n} "
        f"ttft={cfg.ttft_samples} warmup={cfg.warmup} cell-seconds={cfg.cell_seconds}")

    base_env = dict(os.environ)
    base_env.update({
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "PYTHONUNBUFFERED": "1",
    })

    ref_bin = Path(cfg.reference_bin) if cfg.reference_bin else find_reference_bin()
    threadline_bin = Path(sys.executable).parent / "threadline"
    tl_argv_prefix = [str(threadline_bin)] if threadline_bin.exists() else [sys.executable, "-m", "threadline"]

    # Server logs are kept next to the JSON (overwritten each run) for post-mortems.
    logs_dir = Path(cfg.output).resolve().parent
    logs_dir.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="threadline-bench-") as tmp_s:
        tmp = Path(tmp_s)

        # 1. floor
        if "floor" in cfg.skip:
            results["floor"] = {"skipped": "--skip floor"}
        else:
            log(f"\n[floor] graph.ainvoke in-process, InMemorySaver, a thread id per call, on {event_loop_name()}")
            try:
                results["floor"] = run_loop(bench_floor(cfg))
            except Exception as exc:  # noqa: BLE001
                log(f"  floor: FAILED: {type(exc).__name__}: {exc}")
                results["floor"] = {"skipped": f"failed: {type(exc).__name__}: {exc}"}

        # 2. threadline
        if "threadline" in cfg.skip:
            results["threadline"] = {"skipped": "--skip threadline"}
        else:
            port = free_port()
            argv = tl_argv_prefix + [
                "serve", "--config", str(PROJECT_DIR / "langgraph.json"), "--host", "127.0.0.1",
                "--port", str(port), "--database-url", f"sqlite:///{tmp / 'threadline.db'}",
                "--log-level", "warning",
            ]
            if cfg.workers is not None:
                argv += ["--workers", str(cfg.workers)]
            results["threadline"] = run_server_column(
                "threadline", argv, tmp, base_env, logs_dir / "threadline.log", cfg
            )

        # 3. reference
        if "reference" in cfg.skip:
            results["reference"] = {"skipped": "--skip reference"}
        elif ref_bin is None or not ref_bin.exists():
            msg = "reference `langgraph dev` not installed"
            log(f"\n[reference] SKIPPED: {msg}. Install it with:\n  {INSTALL_HINT}")
            results["reference"] = {"skipped": msg, "install": INSTALL_HINT}
        else:
            # Run from a copy of the project so `langgraph dev`'s .langgraph_api/ state
            # goes to the temp dir, not into bench/project.
            ref_project = tmp / "ref_project"
            shutil.copytree(PROJECT_DIR, ref_project, ignore=shutil.ignore_patterns("__pycache__", ".langgraph_api"))
            port = free_port()
            argv = [
                str(ref_bin), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port),
                "--config", str(ref_project / "langgraph.json"), "--server-log-level", "WARNING",
            ]
            results["reference"] = run_server_column(
                "reference", argv, ref_project, base_env, logs_dir / "reference.log", cfg
            )

        # 4. scale-out (PostgreSQL + Redis), compared with the embedded `threadline` column above
        if "scaleout" in cfg.skip:
            scaleout_out = {"skipped": "--skip scaleout"}
        else:
            scaleout_out = scaleout.run(cfg, results, base_env, tl_argv_prefix, logs_dir)

    ratios = compute_ratios(results, cfg)
    table = render_tables(results, ratios, cfg) + scaleout.render(scaleout_out)
    log("\n" + table)

    ref_python = ref_bin.parent / "python" if ref_bin else None
    ref_found = bool(ref_python and ref_python.exists())
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "graph": str(PROJECT_DIR / "graph.py"),
        # The floor, the client and `threadline serve` all run on this loop; the reference picks its own
        # (uvicorn's "auto": uvloop, which its venv installs).
        "event_loop": event_loop_name(),
        "http_client": "aiohttp.ClientSession per server column / scale-out cell "
                       "(TCPConnector limit = max concurrency + 8, keep-alive)",
        "settings": {
            "concurrency": cfg.concurrency, "n_c1": cfg.n1, "n_cgt1": cfg.n, "ttft_samples": cfg.ttft_samples,
            "warmup": cfg.warmup, "cell_seconds": cfg.cell_seconds, "request_timeout": cfg.request_timeout,
            "threadline_workers": cfg.workers if cfg.workers is not None else "default",
            "quick": cfg.quick,
        },
        "versions": {
            "threadline": package_version(None, "threadline"),
            "langgraph": package_version(None, "langgraph"),
            "langchain-core": package_version(None, "langchain-core"),
            "httpx": package_version(None, "httpx"),
            "aiohttp": package_version(None, "aiohttp"),
            "reference_bin": str(ref_bin) if ref_bin else None,
            "reference_langgraph_api": package_version(ref_python, "langgraph-api") if ref_found else None,
            "reference_langgraph_cli": package_version(ref_python, "langgraph-cli") if ref_found else None,
            "reference_langgraph": package_version(ref_python, "langgraph") if ref_found else None,
        },
    }
    out_path = Path(cfg.output)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    everything = {"meta": meta, "results": results, "ratios": ratios, "scaleout": scaleout_out, "table": table}
    out_path.write_text(json.dumps(everything, indent=2) + "\n")
    log(f"\nWrote {out_path}  (total {meta['duration_s']}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
