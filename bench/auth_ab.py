#!/usr/bin/env python
"""What authentication and authorization cost: the bench graph served three times, without auth, with a trivial
`auth.py` (authentication only), and with the same `auth.py` plus an `@auth.on` handler that stamps and filters
on `metadata.owner` (as LangGraph's docs teach), measured in one run, interleaved.

    python bench/auth_ab.py             # 400 c=1 rounds, then c=32 throughput (2,000 waits per server)
    python bench/auth_ab.py 200 1000    # fewer

c=1: each round times `POST /threads/{id}/runs/wait` on each server in turn (the order reverses each round),
so the machine's drift falls on all; the first 20 rounds are warm-up. c=32: stateless `/runs/wait` with 32 in
flight, after a warm-up burst on each, each server in turn, twice (A B C C B A), throughput averaged. First,
in process: the middleware's own cost per request, with and without it in front of a trivial ASGI app, and
the cost of one authorization (the handler's dispatch and call). Prints p50 / p90 per server, the added p50
in ms and the throughput ratios. The auth.py is the least a real one does: read the
`Authorization` header and compare it with a constant.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from bench.harness import free_port, stop_process  # noqa: E402

BODY = {"assistant_id": "bench", "input": {"messages": [{"role": "user", "content": "hi"}]}}
WARMUP = 20
TOKEN = "Bearer bench-token"
AUTH_PY = '''from langgraph_sdk import Auth

auth = Auth()


@auth.authenticate
async def authenticate(authorization: str | None) -> str:
    if authorization != "Bearer bench-token":
        raise Auth.exceptions.HTTPException(status_code=401)
    return "bench-user"
'''
AUTHZ_PY = AUTH_PY + '''

@auth.on
async def owner_only(ctx, value):
    if isinstance(value, dict) and "metadata" in value:
        value["metadata"] = {**(value.get("metadata") or {}), "owner": ctx.user.identity}
    return {"owner": ctx.user.identity}
'''
#: The servers compared: (name, the auth.py they serve, or None).
VARIANTS = (("none", None), ("auth.py", AUTH_PY), ("auth.py+on", AUTHZ_PY))


def project(root: Path, name: str, auth_py: str | None) -> Path:
    folder = root / name
    shutil.copytree(HERE / "project", folder)
    if auth_py is not None:
        (folder / "auth.py").write_text(auth_py)
        (folder / "langgraph.json").write_text(
            '{"dependencies": ["."], "graphs": {"bench": "./graph.py:graph"}, "auth": {"path": "./auth.py:auth"}}')
    return folder


def start(folder: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "THREADLINE_DATABASE_URL": f"sqlite:///{folder / 'bench.db'}",
           "PYTHONPATH": str(HERE.parent)}
    return subprocess.Popen([sys.executable, "-m", "threadline", "serve", "--port", str(port), "--log-level",
                             "warning"], cwd=folder, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(folder / "server.log", "w"), start_new_session=True)


async def ready(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(url + "/ok") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


async def serial(urls: dict[str, str], headers: dict[str, dict[str, str]], rounds: int) -> dict[str, list[float]]:
    sessions = {name: aiohttp.ClientSession(url, headers=headers[name]) for name, url in urls.items()}
    waits: dict[str, list[float]] = {name: [] for name in urls}
    try:
        for n in range(rounds):
            order = list(urls) if n % 2 == 0 else list(reversed(urls))  # reversed: each server goes first
            for name in order:
                session = sessions[name]
                async with session.post("/threads", json={}) as r:
                    thread_id = (await r.json())["thread_id"]
                started = time.perf_counter()
                async with session.post(f"/threads/{thread_id}/runs/wait", json=BODY) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{name}: HTTP {r.status}")
                waits[name].append(time.perf_counter() - started)
    finally:
        for session in sessions.values():
            await session.close()
    return {name: w[WARMUP:] for name, w in waits.items()}


async def throughput(url: str, headers: dict[str, str], total: int, concurrency: int = 32) -> float:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, headers=headers, connector=connector) as session:
        pending = iter(range(total))

        async def loop() -> None:
            for _ in pending:
                async with session.post("/runs/wait", json=BODY) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"HTTP {r.status}")

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return total / (time.perf_counter() - started)


async def middleware_cost(n: int = 20_000) -> float:
    """Microseconds the authentication middleware adds to one request, in process: the same trivial ASGI
    app called with and without it in front (alternating blocks of 1,000), best of the blocks."""
    from langgraph_sdk import Auth

    from threadline.api.auth import Authenticate
    from threadline.core.auth import CustomAuth

    auth = Auth()
    exec(compile(AUTH_PY.split("auth = Auth()", 1)[1], "auth.py", "exec"), {"auth": auth, "Auth": Auth})

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:
        return None

    guarded = Authenticate(endpoint, CustomAuth(auth, "auth.py:auth"), {"/ok"})
    scope = {"type": "http", "method": "POST", "path": "/threads/x/runs/wait", "root_path": "", "query_string": b"",
             "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                         (b"authorization", TOKEN.encode())]}
    best: dict[str, float] = {"plain": float("inf"), "auth": float("inf")}
    for _ in range(n // 1000):
        for name, app in (("plain", endpoint), ("auth", guarded)):
            started = time.perf_counter()
            for _ in range(1000):
                await app(dict(scope), None, None)
            best[name] = min(best[name], (time.perf_counter() - started) / 1000)
    return (best["auth"] - best["plain"]) * 1e6


async def authorization_cost(n: int = 20_000) -> float:
    """Microseconds one authorization takes in process: `Access.filters` dispatching to the owner handler
    (what each core operation asks once, or twice for a run), best of blocks of 1,000."""
    from langgraph_sdk import Auth

    from threadline.core.access import Access
    from threadline.core.auth import as_user, reset_current_user, set_current_user

    auth = Auth()
    exec(compile(AUTHZ_PY.split("auth = Auth()", 1)[1], "auth.py", "exec"), {"auth": auth, "Auth": Auth})
    access = Access.of(auth)
    token = set_current_user(as_user("bench-user"))
    best = float("inf")
    try:
        for _ in range(n // 1000):
            started = time.perf_counter()
            for _ in range(1000):
                await access.filters("threads", "read", {"thread_id": "x"})
            best = min(best, (time.perf_counter() - started) / 1000)
    finally:
        reset_current_user(token)
    return best * 1e6


async def main(rounds: int, total: int) -> None:
    print(f"in process: the middleware and a trivial auth.py add {await middleware_cost():.1f} µs per request; "
          f"one authorization (@auth.on owner filter) takes {await authorization_cost():.1f} µs")
    root = Path(tempfile.mkdtemp(prefix="threadline-auth-bench-"))
    procs = []
    try:
        urls, headers = {}, {}
        for name, auth_py in VARIANTS:
            port = free_port()
            procs.append(start(project(root, name.replace("+", "-").replace(".", "-"), auth_py), port))
            urls[name] = f"http://127.0.0.1:{port}"
            headers[name] = {"authorization": TOKEN} if auth_py else {}
            await ready(urls[name])
        waits = await serial(urls, headers, rounds)
        rates: dict[str, list[float]] = {name: [] for name in urls}
        for name in urls:  # warm-up at c=32 (not counted): the first burst on a server is slower
            await throughput(urls[name], headers[name], total // 4)
        for name in [*urls, *reversed(urls)]:
            rates[name].append(await throughput(urls[name], headers[name], total))
        p50 = {name: statistics.median(w) * 1e3 for name, w in waits.items()}
        for name, w in waits.items():
            print(f"{name:10} c=1 wait p50 {p50[name]:.2f} ms  p90 {statistics.quantiles(w, n=10)[-1] * 1e3:.2f} ms"
                  f"  c=32 {statistics.mean(rates[name]):.0f} runs/s  ({len(w)} waits, {total} x2 at c=32)")
        for name in list(urls)[1:]:
            print(f"added by {name}: {p50[name] - p50['none']:+.2f} ms p50 at c=1; c=32 throughput ratio "
                  f"{statistics.mean(rates[name]) / statistics.mean(rates['none']):.3f}")
    finally:
        for proc in procs:
            stop_process(proc)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(args[0] if args else 400, args[1] if len(args) > 1 else 2000))
