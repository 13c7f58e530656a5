"""Fixtures: the app in-process over each backend, and langgraph-sdk / raw HTTP clients against it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient

from tests.services import Backend, ScaleOut, sweep_stale
from threadline.api.app import create_app
from threadline.core.runtime import Runtime
from threadline.settings import Settings

PROJECT = Path(__file__).parent / "project" / "langgraph.json"
BACKENDS = ["sqlite", "postgres"]


def pytest_sessionstart(session: pytest.Session) -> None:
    sweep_stale()  # what killed sessions left in PostgreSQL and Redis


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's `thread` method (pyproject): a test past its timeout ends the whole run, because a
    hung asyncio test cannot be stopped from inside (its loop may hang again in its own teardown). First,
    the report names the test and shows its loop's tasks, which thread stacks alone do not."""
    if settings.method != "thread":
        return None
    import pytest_timeout

    def expire() -> None:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(item)
        sys.stderr.write(f"\n+++ Timeout: {item.nodeid} still running after {settings.timeout:.0f} s; "
                         "the run stops here\n")
        _dump_loop_tasks()
        pytest_timeout.timeout_timer(item, settings)  # thread stacks, then os._exit(1)

    timer = threading.Timer(settings.timeout, expire)
    timer.name = f"timeout {item.nodeid}"
    timer.daemon = True

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]
    timer.start()
    return True


def _dump_loop_tasks() -> None:
    """The asyncio tasks of the loop running in the main thread, if one is, with their stacks."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None and not (frame.f_code.co_name == "run_forever" and "self" in frame.f_locals):
        frame = frame.f_back
    if frame is None:
        return
    try:
        tasks = asyncio.all_tasks(frame.f_locals["self"])
    except Exception:  # noqa: BLE001 - a diagnostic on the way out: its own failure must not hide the test's
        return
    for task in tasks:
        sys.stderr.write(f"--- {task!r}\n")
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Where a test's server keeps its state: a fresh SQLite file, or a clean PostgreSQL database + Redis."""
    if request.param == "sqlite":
        return Backend("sqlite", f"sqlite:///{tmp_path / 'threadline.db'}")
    services = request.getfixturevalue("scaleout_services")
    return services.fresh()


@pytest.fixture(scope="session")
def scaleout_services() -> Iterator[ScaleOut]:
    services = ScaleOut.connect()
    yield services
    services.close()


@pytest.fixture
def database_url(backend: Backend) -> str:
    return backend.database_url


@pytest.fixture
def settings(backend: Backend) -> Settings:
    return Settings(config=str(PROJECT), workers=4, heartbeat_seconds=5.0, **backend.settings())


@pytest.fixture
async def served(settings: Settings) -> AsyncIterator[tuple[Any, object]]:
    """The FastAPI app, started (lifespan run), and the ASGI callable to send requests to."""
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        yield application, manager.app


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[str]:
    """Threadline served by uvicorn on a free loopback port (for real clients and real sockets); its base URL."""
    async with serving_asgi(create_app(settings)) as url:
        yield url


@contextlib.asynccontextmanager
async def serving_asgi(asgi_app: Any) -> AsyncIterator[str]:
    """Any ASGI app served by uvicorn on a free loopback port; its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(asgi_app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # startup failed: raise its error
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def live_url(settings: Settings) -> AsyncIterator[str]:
    async with serving(settings) as url:
        yield url


@pytest.fixture
def app(served: tuple[Any, object]) -> object:
    return served[1]


@pytest.fixture
def runtime(served: tuple[Any, object]) -> Runtime:
    """The started app's live objects (storage, broker, workers), for tests that must reach inside."""
    return served[0].state.runtime


@pytest.fixture
async def http(app: object) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://threadline", timeout=30) as client:
        yield client


@pytest.fixture
def sdk(http: httpx.AsyncClient) -> LangGraphClient:
    """The official langgraph-sdk client, talking to the app in-process."""
    return LangGraphClient(http)


@pytest.fixture(autouse=True)
def _test_project_on_path() -> None:
    root = str(PROJECT.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    os.environ.setdefault("LANGSMITH_TRACING", "false")
    # Each test (and each backend's run of it) starts with an empty log of the `slow` agent's work.
    from tests.project.agents import WORK_LOG

    WORK_LOG.clear()
