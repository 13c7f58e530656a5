"""What the bench's drivers share: the bench graph's request and its check, the closed-loop cell, server
processes, the measuring HTTP client and the printed figures.

``bench/run.py`` (the server columns) and ``bench/scaleout.py`` (the scale-out cells) both import this
module, and ``run.py`` imports ``scaleout.py``; neither is imported by this one. Moving these pieces here
changed no measurement: the code is the code ``run.py`` held.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

try:
    import aiohttp
except ImportError:  # pragma: no cover - a hint instead of a traceback
    sys.exit('the bench needs aiohttp (the measuring HTTP client): pip install -e ".[test,bench]"')

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
PROJECT_DIR = BENCH_DIR / "project"
GRAPH_ID = "bench"
EXPECTED_REPLY = "the quick brown fox jumps over the lazy dog"
RUN_INPUT = {"messages": [{"role": "user", "content": "hi"}]}

# --------------------------------------------------------------------------- stats


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no samples."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


@dataclass
class CellResult:
    requested: int
    concurrency: int
    completed: int
    errors: int
    wall_s: float
    latencies: list[float]
    first_error: str | None
    truncated: bool
    paired: list[float] | None = None  # the in-process floor, timed right after each request (c=1)

    def summary(self) -> dict[str, Any]:
        rps = self.completed / self.wall_s if self.wall_s > 0 else None
        extra = {} if not self.paired else {
            "paired_floor_samples": len(self.paired),
            "paired_floor_p50_ms": ms(percentile(self.paired, 50)),
        }
        return {**extra,
            "concurrency": self.concurrency,
            "requested": self.requested,
            "completed": self.completed,
            "errors": self.errors,
            "truncated_by_time_limit": self.truncated,
            "wall_s": round(self.wall_s, 4),
            "runs_per_s": None if rps is None else round(rps, 2),
            "p50_ms": ms(percentile(self.latencies, 50)),
            "p90_ms": ms(percentile(self.latencies, 90)),
            "p99_ms": ms(percentile(self.latencies, 99)),
            "mean_ms": ms(sum(self.latencies) / len(self.latencies)) if self.latencies else None,
            "first_error": self.first_error,
        }


async def run_cell(
    op: Callable[[int], Awaitable[None]], n: int, concurrency: int, time_limit_s: float,
    paired: Callable[[], Awaitable[None]] | None = None,
) -> CellResult:
    """Closed loop: `concurrency` workers share `n` requests; each worker sends its
    next request as soon as its previous one finished. No new request starts after
    `time_limit_s` (in-flight ones are allowed to finish).

    `paired` (concurrency 1 only): after each request, one in-process floor run is
    timed too, so the overhead over the floor compares samples taken under the same
    machine conditions (on a shared VM the floor drifts by a millisecond or more
    between minutes; measured alone, before the servers, it would carry that drift)."""
    assert paired is None or concurrency == 1
    latencies: list[float] = []
    paired_latencies: list[float] = []
    errors = 0
    first_error: str | None = None
    next_index = 0
    truncated = False
    start = time.perf_counter()
    stop_at = start + time_limit_s

    async def worker() -> None:
        nonlocal next_index, errors, first_error, truncated
        while next_index < n:
            if time.perf_counter() > stop_at:
                truncated = True
                return
            i = next_index
            next_index += 1
            t0 = time.perf_counter()
            try:
                await op(i)
            except Exception as exc:  # noqa: BLE001 - every failure is counted, first one kept
                errors += 1
                if first_error is None:
                    first_error = f"{type(exc).__name__}: {exc}"[:500]
            else:
                latencies.append(time.perf_counter() - t0)
                if paired is not None:
                    t1 = time.perf_counter()
                    await paired()
                    paired_latencies.append(time.perf_counter() - t1)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    wall = time.perf_counter() - start
    if paired is not None:  # the floor runs are not part of the cell's own throughput
        wall -= sum(paired_latencies)
    return CellResult(n, concurrency, len(latencies), errors, wall, latencies, first_error, truncated,
                      paired_latencies if paired is not None else None)


# --------------------------------------------------------------------------- the graph's answer


def check_values(values: Any) -> None:
    if not isinstance(values, dict):
        raise RuntimeError(f"unexpected output: {str(values)[:300]}")
    if values.get("count") != 1:
        raise RuntimeError(f"unexpected count in output: {str(values)[:300]}")
    msgs = values.get("messages") or []
    last = msgs[-1] if msgs else None
    content = last.get("content") if isinstance(last, dict) else getattr(last, "content", None)
    if content != EXPECTED_REPLY:
        raise RuntimeError(f"unexpected last message in output: {str(values)[:300]}")


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerFailed(RuntimeError):
    pass


class CellFailed(RuntimeError):
    pass


def failed_cell(n: int, c: int, error: str) -> dict[str, Any]:
    return {
        "concurrency": c, "requested": n, "completed": 0, "errors": n, "truncated_by_time_limit": False,
        "wall_s": 0.0, "runs_per_s": None, "p50_ms": None, "p90_ms": None, "p99_ms": None, "mean_ms": None,
        "first_error": error[:500], "failed": True,
    }


@contextmanager
def server_process(name: str, argv: list[str], cwd: Path, env: dict[str, str],
                   log_path: Path) -> Iterator[subprocess.Popen]:
    """Start a server subprocess (in its own process group) and always stop it."""
    log_file = open(log_path, "wb")  # noqa: SIM115 - open while the server runs; closed in the `finally` below
    proc = subprocess.Popen(
        argv, cwd=str(cwd), env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        yield proc
    finally:
        stop_process(proc)
        log_file.close()


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    # Only the process group this script created (start_new_session=True).
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def wait_ready(base_url: str, proc: subprocess.Popen, timeout_s: float) -> float:
    """Poll GET /ok (bounded by time) until it answers 200; returns seconds waited."""
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=2.0) as client:
        while time.perf_counter() - t0 < timeout_s:
            if proc.poll() is not None:
                raise ServerFailed(f"server exited with code {proc.returncode} before /ok answered")
            try:
                r = await client.get("/ok")
                if r.status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise ServerFailed(f"/ok did not answer 200 within {timeout_s:.0f}s")


def raise_for(r: Reply | httpx.Response, what: str) -> None:
    if r.status_code >= 300:
        raise RuntimeError(f"{what} -> HTTP {r.status_code}: {r.text[:300]}")


# --------------------------------------------------------------------------- measuring client


@dataclass
class Reply:
    """A fully read response of a measured request (the parts the checks look at)."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


def client_session(base_url: str, max_concurrency: int, timeout_s: float) -> aiohttp.ClientSession:
    """The client of every measured request (server columns and scale-out cells alike): a pool of
    `max_concurrency + 8` keep-alive connections, and `timeout_s` for connecting (pool wait included)
    and for each read, like the httpx client it replaced (``timeout=timeout_s``: connect/read/pool,
    no total)."""
    connector = aiohttp.TCPConnector(limit=max_concurrency + 8, limit_per_host=0, keepalive_timeout=5.0)
    timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_connect=timeout_s, sock_read=timeout_s)
    return aiohttp.ClientSession(base_url=base_url, connector=connector, timeout=timeout)


async def fetch(session: aiohttp.ClientSession, method: str, path: str, *, json_body: Any = None,
                params: dict[str, str] | None = None) -> Reply:
    """One request, its body read in full (the connection goes back to the pool)."""
    async with session.request(method, path, json=json_body, params=params) as resp:
        return Reply(resp.status, await resp.read())


# --------------------------------------------------------------------------- output


def log(msg: str) -> None:
    print(msg, flush=True)


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def fmt_cell(s: dict[str, Any]) -> str:
    extra = f" errors={s['errors']}" if s["errors"] else ""
    extra += " (time limit hit)" if s["truncated_by_time_limit"] else ""
    return (
        f"n={s['completed']:<4} {fmt(s['runs_per_s']):>7} runs/s  p50={fmt(s['p50_ms']):>7} ms"
        f"  p99={fmt(s['p99_ms']):>7} ms{extra}"
    )


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)
