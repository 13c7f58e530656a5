"""The two servers as real processes on loopback, and a recording langgraph-sdk client for scripted sessions.

The reference is LangGraph's own server (`langgraph dev` from `langgraph-cli[inmem]`), installed by
`scripts/test` into its own venv (`.venv-ref`, or `THREADLINE_REF_VENV`; tests/environments.py). It is used
only as a test oracle:
nothing of it is imported here, it is run as a separate program.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from tests.differential.compare import Exchange
from tests.environments import in_ci, reference_venv

ROOT = Path(__file__).resolve().parents[2]
GALLERY = ROOT / "tests" / "gallery" / "langgraph.json"
REFERENCE_REQUIREMENTS = Path(__file__).with_name("reference.txt")
T = TypeVar("T")


def unavailable(reason: str) -> None:
    """Skip locally, fail under CI: the differential suite is part of what CI proves."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the differential suite must run; scripts/test installs the reference)")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A server process on a loopback port, with its log."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def start(name: str, command: list[str], cwd: Path, env: dict[str, str], port: int) -> Server:
    log = cwd / f"{name}.log"
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    server = Server(name, f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{server.tail()}")
        try:
            if httpx.get(f"{server.url}/ok", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"{name} did not answer /ok within 120 s:\n{server.tail()}")


def _quiet_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("THREADLINE_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(LANGSMITH_TRACING="false", LANGCHAIN_TRACING_V2="false", LANGGRAPH_CLI_NO_ANALYTICS="1",
               LANGSMITH_API_KEY="", LANGCHAIN_API_KEY="")
    return env


def start_reference(workdir: Path) -> Server:
    langgraph = reference_venv() / "bin" / "langgraph"
    if not langgraph.exists():
        unavailable(f"the reference server is not installed ({langgraph} is missing; scripts/test installs it)")
    # `langgraph dev` resolves graph paths against its working folder and keeps its in-memory data in
    # ./.langgraph_api between starts: it runs in a fresh copy of the gallery.
    folder = workdir / "reference"
    shutil.copytree(GALLERY.parent, folder, ignore=shutil.ignore_patterns("__pycache__", ".langgraph_api"))
    port = free_port()
    command = [str(langgraph), "dev", "--no-browser", "--no-reload", "--port", str(port), "--config", "langgraph.json"]
    try:
        return start("reference", command, folder, _quiet_env(), port)
    except RuntimeError as exc:
        unavailable(f"the reference server did not start: {exc}")
        raise


def start_threadline(workdir: Path) -> Server:
    folder = workdir / "threadline"
    folder.mkdir()
    port = free_port()
    env = {**_quiet_env(), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "threadline", "serve", "--config", str(GALLERY), "--port", str(port),
               "--database-url", f"sqlite:///{folder / 'threadline.db'}"]
    return start("threadline", command, folder, env, port)


# --- recording ---------------------------------------------------------------------------------------
_step: contextvars.ContextVar[str] = contextvars.ContextVar("step", default="?")
#: For a stream that stays open (a thread's stream): record what arrived within this many seconds, or until
#: this text arrived.
_open_for: contextvars.ContextVar[float | None] = contextvars.ContextVar("open_for", default=None)
_until_text: contextvars.ContextVar[str | None] = contextvars.ContextVar("until_text", default=None)
#: Record the status alone (the acceptance audit compares whether a request was accepted, not its answer).
_status_only: contextvars.ContextVar[bool] = contextvars.ContextVar("status_only", default=False)


class _Recording(httpx.AsyncBaseTransport):
    """Passes requests on and records each exchange whole (streams are read to their end first)."""

    def __init__(self, exchanges: list[Exchange]) -> None:
        # Idle connections are dropped after 1 s, before either server closes them (uvicorn's keep-alive is
        # 5 s, as httpx's default expiry): else a request sent on a connection the server is closing at that
        # instant fails with "Server disconnected without sending a response" (seen on both servers under load).
        self._inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(keepalive_expiry=1.0))
        self._exchanges = exchanges
        self.stream_opened = asyncio.Event()  # set when a stream that stays open has its response's headers

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        limit = _open_for.get()
        if limit is None:
            content = await response.aread()  # decoded (gzip etc.)
        else:
            self.stream_opened.set()
            chunks: list[bytes] = []
            until = _until_text.get()
            try:
                async with asyncio.timeout(limit) as deadline:
                    async for chunk in response.aiter_bytes():
                        chunks.append(chunk)
                        if until and until in b"".join(chunks).decode("utf-8", "replace").replace(" ", ""):
                            until = None  # seen: take what follows within a moment, then stop
                            deadline.reschedule(asyncio.get_running_loop().time() + 0.5)
            except TimeoutError:
                pass
            content = b"".join(chunks)
        await response.aclose()
        exchange = Exchange.of(_step.get(), request, response, content)
        if _status_only.get():
            exchange.headers, exchange.body, exchange.sse = {}, None, False
        self._exchanges.append(exchange)
        headers = [(k, v) for k, v in response.headers.items()
                   if k.lower() not in ("content-encoding", "content-length",
                                                                                       "transfer-encoding")]
        return httpx.Response(response.status_code, headers=headers, content=content, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Session:
    """One scripted session against one server: the official client, and what it exchanged."""

    name: str
    url: str
    exchanges: list[Exchange] = field(default_factory=list)
    error: str | None = None

    def __post_init__(self) -> None:
        self._transport = _Recording(self.exchanges)
        self.http = httpx.AsyncClient(base_url=self.url, transport=self._transport, timeout=60)
        self.client = LangGraphClient(self.http)

    async def opened(self, timeout: float = 30) -> None:
        """Wait until a stream collected with `open_for` (in another task) has its response's headers."""
        async with asyncio.timeout(timeout):
            await self._transport.stream_opened.wait()
        self._transport.stream_opened.clear()

    async def do(self, step: str, call: Awaitable[T]) -> T | None:
        """Await one client call labelled `step`; an HTTP error is recorded (not raised) and gives None."""
        _step.set(step)
        try:
            return await call
        except httpx.HTTPStatusError:
            return None

    async def collect(self, step: str, parts: Any, *, open_for: float | None = None,
                      until_text: str | None = None) -> list[Any]:
        """All parts of a stream; with `open_for`, of a stream that stays open: what came in that time, or
        until `until_text` came (then what follows within half a second)."""
        _step.set(step)
        _open_for.set(open_for)
        _until_text.set(until_text)
        try:
            if inspect.isawaitable(parts):  # langgraph-sdk's threads.join_stream is a coroutine giving the stream
                parts = await parts
            return [part async for part in parts]
        except httpx.HTTPStatusError:
            return []
        finally:
            _open_for.set(None)
            _until_text.set(None)

    async def raw(self, step: str, method: str, path: str, *, open_for: float | None = None,
                  until_text: str | None = None, **kwargs: Any) -> httpx.Response:
        """A request the SDK has no call for; `open_for` as in `collect`, ended early once `until_text` came."""
        _step.set(step)
        _open_for.set(open_for)
        _until_text.set(until_text)
        try:
            return await self.http.request(method, path, **kwargs)
        finally:
            _open_for.set(None)
            _until_text.set(None)

    async def status(self, step: str, method: str, path: str, **kwargs: Any) -> int:
        """A request whose status alone is recorded (the acceptance audit: accepted or refused, not the answer,
        which other sessions compare). A stream is read to its end, as `raw` reads it."""
        _step.set(step)
        _status_only.set(True)
        try:
            return (await self.http.request(method, path, **kwargs)).status_code
        finally:
            _status_only.set(False)

    async def until(self, step: str, check: Any, timeout: float = 60) -> Any:
        """Poll `check()` (unrecorded GETs) until it returns something truthy."""
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as plain:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                found = await check(LangGraphClient(plain))
                if found:
                    return found
                await asyncio.sleep(0.05)
        raise AssertionError(f"{self.name}: {step} never happened on {self.url}")

    async def close(self) -> None:
        await self.http.aclose()
