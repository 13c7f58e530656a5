"""What a Threadline server still holds after long streamed runs, and why (issue 24: memory back down after).

Starts `threadline serve` on a fresh SQLite file with `bench/workloads_project` (the `chat` graph), runs
`--runs` concurrent runs of a `--tokens`-chunk reply in `--mode` (`POST /runs/wait` by default: the events are
produced and held the same way whether or not a client reads them; `--stream` reads them over SSE instead), and
reads the server's RSS:

* ``end``   - right after the runs;
* ``+5s``   - five seconds later, after one more small run (which lets the broker drop buffers past
              `--retain-seconds`);
* ``gc``    - after a full `gc.collect()` in the server;
* ``trim``  - after glibc's `malloc_trim(0)` in the server.

The server gets the two last steps through signals (SIGUSR2: collect; SIGUSR1: trim) from a `sitecustomize`
this script writes to a temporary folder on the server's PYTHONPATH; `--retain-seconds` sets
`MemoryBroker.retain_seconds` there (default: the product's own, 600). Run it with the server's default
allocator and with `--malloc` (`PYTHONMALLOC=malloc`) to tell live data from memory the allocator keeps:

    python bench/memory_after.py                          # 8 x 16,000 tokens, messages-tuple
    python bench/memory_after.py --retain-seconds 2       # the finished runs' buffers dropped before `+5s`
    python bench/memory_after.py --malloc                 # glibc's allocator for everything (then `trim` tells)
    python bench/memory_after.py --mode values            # few events: the baseline
    PYTHONPATH=/tmp/other-checkout python bench/memory_after.py   # that checkout's `threadline` package

A measuring tool: no thresholds, numbers in bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
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
'''


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


def start_server(cfg: argparse.Namespace, folder: Path) -> subprocess.Popen[bytes]:
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # Its own folder first, then a PYTHONPATH given (another checkout's `threadline`, for an A/B).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
    if cfg.retain_seconds is not None:
        env["BENCH_RETAIN_SECONDS"] = str(cfg.retain_seconds)
    if cfg.malloc:
        env["PYTHONMALLOC"] = "malloc"
    return subprocess.Popen(
        [sys.executable, "-m", "threadline", "serve", "--config", str(PROJECT / "langgraph.json"), "--port",
         str(cfg.port), "--database-url", f"sqlite:///{folder}/bench.db", "--log-level", "warning"],
        env=env, cwd=folder, stdout=subprocess.DEVNULL)


async def measure(cfg: argparse.Namespace, server: subprocess.Popen[bytes]) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{cfg.port}", timeout=cfg.timeout) as client:
        deadline = time.monotonic() + 120
        while True:
            try:
                if (await client.get("/ok")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start")
            await asyncio.sleep(0.2)
        await one_run(client, 20, cfg.mode, cfg.stream)  # warm: every import and first-use cache
        out = {"before": rss_mb(server.pid)}
        await asyncio.gather(*(one_run(client, cfg.tokens, cfg.mode, cfg.stream) for _ in range(cfg.runs)))
        out["end"] = rss_mb(server.pid)
        await asyncio.sleep(5)
        await one_run(client, 20, cfg.mode, cfg.stream)
        await asyncio.sleep(0.5)
        out["+5s"] = rss_mb(server.pid)
        for name, sig in (("gc", signal.SIGUSR2), ("trim", signal.SIGUSR1)):
            server.send_signal(sig)
            await asyncio.sleep(1.5)
            out[name] = rss_mb(server.pid)
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--tokens", type=int, default=16000)
    p.add_argument("--mode", default="messages-tuple")
    p.add_argument("--stream", action="store_true", help="Read each run over SSE (default: POST /runs/wait).")
    p.add_argument("--retain-seconds", type=float, default=None)
    p.add_argument("--malloc", action="store_true", help="PYTHONMALLOC=malloc in the server.")
    p.add_argument("--port", type=int, default=48300)
    p.add_argument("--timeout", type=float, default=900)
    cfg = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(cfg, Path(tmp))
        try:
            out = asyncio.run(measure(cfg, server))
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
    setup = (f"{cfg.runs} x {cfg.tokens} tokens, {cfg.mode}, {'SSE' if cfg.stream else '/runs/wait'}, "
             f"retain {cfg.retain_seconds if cfg.retain_seconds is not None else 'default'}, "
             f"{'malloc' if cfg.malloc else 'pymalloc'}")
    print(f"{setup}: " + ", ".join(f"{k} {v} MB" for k, v in out.items()))


if __name__ == "__main__":
    main()
