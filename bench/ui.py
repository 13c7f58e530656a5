#!/usr/bin/env python
"""How long the web console's pages take with 10,000 threads in the embedded default (one SQLite file).

    python bench/ui.py                 # 10,000 threads, 30 loads per page
    python bench/ui.py --threads 1000 --loads 10

`threadline serve` runs as a subprocess on a fresh SQLite file with the bundled example agents; the threads
are made through the API (a few with a chat, an interrupt and a store), then each page is fetched `--loads`
times in a row: the server's time for the page's HTML (aiohttp, as bench/run.py measures) and, when Debian's
chromium and Playwright are there, the browser's load (navigation start to the load event, assets included).
Against a baseline measured in the same run: `GET /ok`, the null round trip. The aim is under 300 ms a page;
this is a measuring tool, never a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def start(folder: Path) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    proc = subprocess.Popen([sys.executable, "-m", "threadline", "serve", "--port", "0", "--log-level", "warning"],
                            cwd=folder, env={**env, "PYTHONUNBUFFERED": "1"}, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return proc, found.group(1).rstrip("/")
    raise SystemExit("threadline serve did not start")


async def seed(session: aiohttp.ClientSession, url: str, count: int) -> dict[str, str]:
    """`count` threads (metadata `user` among 100 users); a chat, an interrupt and store items among them."""
    made = 0

    async def make(n: int) -> None:
        nonlocal made
        while made < n:
            made += 1
            async with session.post(f"{url}/threads", json={"metadata": {"user": f"u{made % 100}", "n": made}}) as r:
                r.raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(make(count - 2) for _ in range(8)))
    print(f"made {count - 2} threads in {time.perf_counter() - started:.1f} s", flush=True)

    async def thread_run(graph: str, payload: dict[str, Any]) -> tuple[str, str]:
        async with session.post(f"{url}/threads", json={"metadata": {"user": "ada"}}) as r:
            thread = (await r.json())["thread_id"]
        async with session.post(f"{url}/threads/{thread}/runs/wait", json={"assistant_id": graph, **payload}) as r:
            r.raise_for_status()
        async with session.get(f"{url}/threads/{thread}/runs") as r:
            return thread, (await r.json())[0]["run_id"]

    chat, run = await thread_run("assistant", {"input": {"messages": [{"role": "user", "content": "hi there"}]}})
    waiting, _ = await thread_run("approval", {"input": {"request": "deploy"}})
    for i in range(50):
        async with session.put(f"{url}/store/items", json={"namespace": ["users", f"u{i % 5}"], "key": f"k{i}",
                                                           "value": {"text": f"note {i}"}}) as r:
            r.raise_for_status()
    async with session.post(f"{url}/assistants/search", json={"graph_id": "assistant"}) as r:
        assistant = (await r.json())[0]["assistant_id"]
    return {"chat": chat, "run": run, "waiting": waiting, "assistant": assistant}


def pages(ids: dict[str, str]) -> list[tuple[str, str]]:
    return [
        ("threads (first page)", "/console/threads"),
        ("threads (page 200)", "/console/threads?page=200"),
        ("threads by metadata", '/console/threads?metadata={"user": "u7"}'),
        ("threads by status", "/console/threads?status=interrupted"),
        ("thread (chat)", f"/console/threads/{ids['chat']}"),
        ("thread (interrupt)", f"/console/threads/{ids['waiting']}"),
        ("run", f"/console/threads/{ids['chat']}/runs/{ids['run']}"),
        ("assistants", "/console/assistants"),
        ("assistant (graph)", f"/console/assistants/{ids['assistant']}"),
        ("store", "/console/store?ns=users"),
        ("queue", "/console/queue"),
    ]


async def server_times(session: aiohttp.ClientSession, url: str, path: str, loads: int) -> list[float]:
    out = []
    for i in range(loads + 3):  # three to warm up
        started = time.perf_counter()
        async with session.get(url + path) as r:
            await r.read()
            assert r.status == 200, (path, r.status)
        if i >= 3:
            out.append((time.perf_counter() - started) * 1000)
    return out


def browser_times(url: str, targets: list[tuple[str, str]], loads: int) -> dict[str, list[float]] | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not os.path.exists(CHROMIUM):
        return None
    out: dict[str, list[float]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 860})
        for name, path in targets:
            times = []
            for i in range(loads + 2):
                page.goto(url + path, wait_until="load")
                took = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
                if i >= 2:
                    times.append(float(took))
            out[name] = times
        browser.close()
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(url: str, count: int,
                  loads: int) -> tuple[list[tuple[str, str]], dict[str, list[float]], list[float]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        ids = await seed(session, url, count)
        targets = pages(ids)
        ok = await server_times(session, url, "/ok", loads)
        return targets, {name: await server_times(session, url, path, loads) for name, path in targets}, ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=10_000)
    parser.add_argument("--loads", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        proc, url = start(Path(folder))
        try:
            targets, server, ok = asyncio.run(measure(url, args.threads, args.loads))
            browser = browser_times(url, targets, max(5, args.loads // 3))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    base = statistics.median(ok)
    print(f"\n{args.threads} threads, embedded default (SQLite); GET /ok p50 {base:.2f} ms (the baseline)")
    print(f"{'page':24} {'server p50':>11} {'p95':>8} {'x /ok':>7} {'browser load p50':>17} {'p95':>8}")
    for name, _ in targets:
        s = server[name]
        b = browser.get(name) if browser else None
        btxt = f"{statistics.median(b):14.1f} ms {p(b, 0.95):6.1f}" if b else f"{'(no chromium)':>17}"
        print(f"{name:24} {statistics.median(s):8.1f} ms {p(s, 0.95):6.1f} {statistics.median(s) / base:7.1f} {btxt}")


if __name__ == "__main__":
    main()
