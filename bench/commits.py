#!/usr/bin/env python
"""Two commits of Threadline measured in one run, alternated: the guard against the next regression.

    python bench/commits.py                      # the commit of the committed results vs the working tree
    python bench/commits.py OLD NEW              # any two commits (or `.` for the working tree)
    python bench/commits.py --bisect GOOD BAD    # the first-parent commit between them where c=1 wait slowed
    python bench/commits.py --bisect GOOD BAD --metric "c=32 runs/s"

Each commit is checked out into a temporary worktree (`git worktree add --detach`) and served by its own
`threadline serve` (the checkout on PYTHONPATH, this venv's dependencies, a fresh SQLite database, the bench
graph `bench/project`). Both servers run side by side, and every measurement alternates between them, so the
machine's drift from one minute to the next falls on both alike:

- `wait c=1`: `POST /threads/{id}/runs/wait` on a new thread, one at a time (p50, p90);
- `stateless c=1`: `POST /runs/wait`, one at a time;
- `ttft c=1`: `POST /runs/stream` in `messages-tuple` mode, time to the first token;
- `c=32 runs/s`: bursts of 32 concurrent thread waits, alternated burst by burst.

It prints each cell for both and the ratio NEW/OLD (above 1 is slower for latencies, below 1 is slower for
runs/s). The default OLD is the last commit that changed `bench/results/latest.json` (the last release point's
results). No timing assertion anywhere: a tool for the closing note of every performance change.
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
from collections.abc import Iterator
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import free_port, server_process, tail, wait_ready

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "bench" / "project"
MESSAGES = [{"role": "user", "content": "hi"}]
BODY = {"assistant_id": "bench", "input": {"messages": MESSAGES}}
STREAM = {**BODY, "stream_mode": ["messages-tuple"]}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def results_commit() -> str:
    return git("log", "-1", "--format=%H", "--", "bench/results/latest.json")


@contextlib.contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """The source of `ref` (`.` is the working tree) in a folder, removed afterwards."""
    if ref == ".":
        yield REPO
        return
    folder = Path(tempfile.mkdtemp(prefix="tl-commit-"))
    git("worktree", "add", "--detach", "--force", str(folder), ref)
    try:
        yield folder
    finally:
        git("worktree", "remove", "--force", str(folder))


@contextlib.contextmanager
def serve(source: Path, workdir: Path, name: str) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env.update(PYTHONPATH=str(source), THREADLINE_DATABASE_URL=f"sqlite:///{workdir / (name + '.db')}",
               LANGSMITH_TRACING="false")
    argv = [sys.executable, "-m", "threadline", "serve", "--port", str(port), "--log-level", "warning"]
    with server_process(name, argv, PROJECT, env, workdir / f"{name}.log") as proc:
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(wait_ready(url, proc, 120))
        except Exception as exc:
            raise SystemExit(f"{name} ({source}) did not start: {exc}\n{tail(workdir / f'{name}.log')}") from exc
        yield url


async def _wait(session: aiohttp.ClientSession, stateless: bool) -> float:
    if stateless:
        started = time.perf_counter()
        async with session.post("/runs/wait", json=BODY) as r:
            await r.read()
    else:
        async with session.post("/threads", json={}) as r:
            thread_id = (await r.json())["thread_id"]
        started = time.perf_counter()
        async with session.post(f"/threads/{thread_id}/runs/wait", json=BODY) as r:
            await r.read()
    if r.status != 200:
        raise RuntimeError(f"{session._base_url}: HTTP {r.status}")
    return time.perf_counter() - started


async def _ttft(session: aiohttp.ClientSession) -> float:
    started = time.perf_counter()
    async with session.post("/runs/stream", json=STREAM) as r:
        async for line in r.content:
            if line.startswith(b"event: messages"):
                first = time.perf_counter() - started
                await r.read()
                return first
    raise RuntimeError("no messages event")


async def _burst(session: aiohttp.ClientSession, c: int) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(_wait(session, False) for _ in range(c)))
    return c / (time.perf_counter() - started)


async def measure(urls: list[str], rounds: int, bursts: int, warmup: int = 20) -> list[dict[str, float]]:
    """Every cell for each server, alternating request by request (burst by burst for c=32)."""
    connector = [aiohttp.TCPConnector(limit=64) for _ in urls]
    sessions = [aiohttp.ClientSession(u, connector=k) for u, k in zip(urls, connector, strict=True)]
    samples: list[dict[str, list[float]]] = [{} for _ in urls]
    try:
        cells = [("wait c=1", lambda s: _wait(s, False)), ("stateless c=1", lambda s: _wait(s, True)),
                 ("ttft c=1", _ttft)]
        for round_ in range(warmup + rounds):
            for i in (range(len(urls)) if round_ % 2 else reversed(range(len(urls)))):
                for name, call in cells:
                    value = await call(sessions[i])
                    if round_ >= warmup:
                        samples[i].setdefault(name, []).append(value)
        for burst in range(bursts + 1):
            for i in (range(len(urls)) if burst % 2 else reversed(range(len(urls)))):
                value = await _burst(sessions[i], 32)
                if burst:  # the first burst of each warms the pools
                    samples[i].setdefault("c=32 runs/s", []).append(value)
    finally:
        for s in sessions:
            await s.close()
    out = []
    for per in samples:
        cell: dict[str, float] = {}
        for name, values in per.items():
            if name.endswith("runs/s"):
                cell[name] = statistics.median(values)
            else:
                cell[f"{name} p50 ms"] = statistics.median(values) * 1e3
                cell[f"{name} p90 ms"] = statistics.quantiles(values, n=10)[-1] * 1e3
        out.append(cell)
    return out


def compare(old: str, new: str, rounds: int, bursts: int) -> tuple[dict[str, float], dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp, checkout(old) as old_src, checkout(new) as new_src, \
            serve(old_src, Path(tmp), "old") as old_url, serve(new_src, Path(tmp), "new") as new_url:
        a, b = asyncio.run(measure([old_url, new_url], rounds, bursts))
    return a, b


def table(old: str, new: str, a: dict[str, float], b: dict[str, float]) -> str:
    rows = [f"| cell | {old[:10]} (old) | {new[:10]} (new) | new/old |", "|---|---:|---:|---:|"]
    for key in a:
        rows.append(f"| {key} | {a[key]:.2f} | {b[key]:.2f} | {b[key] / a[key]:.2f} |")
    return "\n".join(rows)


def _cost(cells: dict[str, float], metric: str) -> float:
    """The metric as a cost (higher is slower): a latency as it is, a throughput inverted."""
    return 1 / cells[metric] if metric.endswith("runs/s") else cells[metric]


def bisect(good: str, bad: str, rounds: int, bursts: int, metric: str) -> None:
    """Binary search over first-parent commits for the first whose `metric` is nearer BAD's than GOOD's, each
    step an alternated A/B of the candidate against GOOD (so each verdict is a ratio, not an absolute)."""
    commits = git("rev-list", "--first-parent", "--reverse", f"{good}..{bad}").split()
    base, worst = compare(good, bad, rounds, bursts)
    cut = 1 + (_cost(worst, metric) / _cost(base, metric) - 1) / 2
    print(f"{good[:10]} -> {bad[:10]}: {metric} {base[metric]:.2f} -> {worst[metric]:.2f}; a commit is slow when "
          f"its cost relative to {good[:10]} exceeds {cut:.3f}", flush=True)
    lo, hi = 0, len(commits) - 1  # commits[hi] is slow (it is BAD); find the first slow one
    while lo < hi:
        mid = (lo + hi) // 2
        a, b = compare(good, commits[mid], rounds, bursts)
        relative = _cost(b, metric) / _cost(a, metric)
        slow = relative > cut
        print(f"  {commits[mid][:10]} ({mid + 1}/{len(commits)}): {metric} {a[metric]:.2f} -> {b[metric]:.2f}, "
              f"cost x{relative:.3f} -> {'slow' if slow else 'fast'}  "
              f"{git('log', '-1', '--format=%s', commits[mid])[:90]}",
              flush=True)
        if slow:
            hi = mid
        else:
            lo = mid + 1
    print(f"first slow commit: {commits[lo]} {git('log', '-1', '--format=%s', commits[lo])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", nargs="?", help="default: the last commit of bench/results/latest.json")
    parser.add_argument("new", nargs="?", default=".", help="default: the working tree")
    parser.add_argument("--rounds", type=int, default=200, help="measured rounds of the c=1 cells (default 200)")
    parser.add_argument("--bursts", type=int, default=8, help="c=32 bursts per server (default 8)")
    parser.add_argument("--bisect", action="store_true", help="OLD is good, NEW is slow: find the first slow commit")
    parser.add_argument("--metric", default="wait c=1 p50 ms", help="the cell --bisect decides on "
                        "(default 'wait c=1 p50 ms'; e.g. 'c=32 runs/s')")
    parser.add_argument("--json", type=Path, help="also write the cells here")
    args = parser.parse_args()
    old = args.old or results_commit()
    if args.bisect:
        bisect(old, args.new, args.rounds, args.bursts if args.metric.endswith('runs/s') else 0, args.metric)
        return
    a, b = compare(old, args.new, args.rounds, args.bursts)
    new_label = "working tree" if args.new == "." else args.new
    print(table(old, new_label, a, b))
    if args.json:
        args.json.write_text(json.dumps({"old": old, "new": new_label, "old_cells": a, "new_cells": b}, indent=2))


if __name__ == "__main__":
    main()
