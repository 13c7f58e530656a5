"""Fixtures: the app in-process over each backend, and langgraph-sdk / raw HTTP clients against it.

Kinds of test, as markers (`-m`): `unit` (no backend), `integration` (the `backend` fixture: SQLite and
PostgreSQL + Redis), `e2e` (starts real processes; always `slow` too). `-m "not slow"` is the fast loop.
A module whose tests only read, or use ids of their own, shares one started app per backend
(`module_served`); the others start one per test (`served`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import uvicorn
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient

from tests import ending, processes
from tests.services import Backend, ScaleOut, sweep_stale
from threadline.api.app import create_app
from threadline.core.runtime import Runtime
from threadline.settings import Settings
from threadline.storage import open_storage

PROJECT = Path(__file__).parent / "project" / "langgraph.json"
BACKENDS = ["sqlite", "postgres"]


def pytest_sessionstart(session: pytest.Session) -> None:
    sweep_stale()  # what killed sessions left in PostgreSQL and Redis


def pytest_configure(config: pytest.Config) -> None:
    processes.watch(config)
    if not config.pluginmanager.has_plugin("threadline-ending"):
        config.pluginmanager.register(ending, "threadline-ending")  # timeouts, and processes left running


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The kind of each test, as a marker: e2e (marked so by its module; slow too), integration (runs on
    every backend), or unit."""
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            if item.get_closest_marker("slow") is None:
                item.add_marker(pytest.mark.slow)
        elif {"backend", "module_backend"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Where a test's server keeps its state: a fresh SQLite file, or a clean PostgreSQL database + Redis."""
    return fresh_backend(request, tmp_path)


def fresh_backend(request: pytest.FixtureRequest, folder: Path) -> Backend:
    """`request.param`'s backend, empty: a copy of the migrated SQLite file in `folder`, or PostgreSQL's
    tables emptied and a new Redis key prefix."""
    if request.param == "sqlite":
        path = folder / "threadline.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return Backend("sqlite", f"sqlite:///{path}")
    services = request.getfixturevalue("scaleout_services")
    return services.fresh()


@pytest.fixture(scope="module", params=BACKENDS)
def module_backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    """`backend` for a whole module: its tests share one server per backend (`module_served`), so they must
    only read or use ids of their own, never count or list what every test made."""
    project_on_path()  # set up before the autouse fixture below, and the project's app imports from it
    return fresh_backend(request, tmp_path_factory.mktemp(f"module-{request.param}"))


@pytest.fixture
def own_backend(module_backend: Backend, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """For a test of a module that shares its app but starts an app (or opens storage) of its own beside it:
    a fresh copy of the SQLite template, or the session's second PostgreSQL database (`spare_services`),
    emptied, and a new Redis key prefix. Not the module's database: the shared app's in-process workers would
    take the runs of the test's own app, which may serve another project or other settings (a fresh-clone CI
    run saw a deepagents subagent's run fail so, and a worker process's test see its run taken before the
    process had started); and not the session's, which the module's app is on."""
    if module_backend.kind == "sqlite":
        path = tmp_path / "own.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return Backend("sqlite", f"sqlite:///{path}")
    return request.getfixturevalue("spare_services").fresh()


@pytest.fixture(scope="module")
def module_settings(module_backend: Backend) -> Settings:
    """`settings` for a module that shares its app (a module may override it, as it may `settings`)."""
    return Settings(config=str(PROJECT), workers=4, heartbeat_seconds=5.0, **module_backend.settings())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_served(module_settings: Settings) -> AsyncIterator[tuple[Any, object]]:
    """`served` shared by a module's tests, once per backend. Such a module runs in one event loop, the app's,
    and points the fixtures its tests take at the shared ones (`tests/shared_app.py`):

        pytestmark = pytest.mark.asyncio(loop_scope="module")
        backend, served, http = shared_app()

    (`app`, `runtime`, `settings` and `sdk` follow.)"""
    application = create_app(module_settings)
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        yield application, manager.app


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_http(module_served: tuple[Any, object]) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=module_served[1])  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://threadline", timeout=30) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_live_url(module_served: tuple[Any, object]) -> AsyncIterator[str]:
    """`live_url` for a module that shares its app: the same started app, over uvicorn on a loopback port."""
    async with serving_asgi(module_served[1], lifespan="off") as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once for the session (ours, the checkpointer's, the store's tables): each
    SQLite test starts from a copy of it, as PostgreSQL tests start from emptied tables, instead of
    migrating its own. The app still applies whatever is missing at start, as on any existing file."""
    path = tmp_path_factory.mktemp("sqlite-template") / "threadline.db"

    async def migrate() -> None:
        storage = await open_storage(f"sqlite:///{path}")
        await storage.close()

    # In a thread of its own: a session fixture may be set up while a test's event loop runs.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, migrate()).result(timeout=60)
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0, "the template's WAL was not checkpointed at close"
    return path


@pytest.fixture(scope="session")
def scaleout_services() -> Iterator[ScaleOut]:
    services = ScaleOut.connect()
    yield services
    services.close()


@pytest.fixture(scope="session")
def spare_services() -> Iterator[ScaleOut]:
    """A second PostgreSQL database for the session, which no module's shared app is on: `own_backend`'s,
    emptied for each test as the first is (a database created and migrated for each such test cost
    0.2-0.5 s of its start)."""
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
async def serving_asgi(asgi_app: Any, *, lifespan: str = "auto") -> AsyncIterator[str]:
    """Any ASGI app served by uvicorn on a free loopback port; its base URL. `lifespan="off"` for an app
    already started."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(asgi_app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan=lifespan))  # type: ignore[arg-type]
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
    project_on_path()
    # Each test (and each backend's run of it) starts with an empty log of the `slow` agent's work.
    from tests.project.agents import WORK_LOG

    WORK_LOG.clear()


def project_on_path() -> None:
    """The test project's modules importable (its graphs, auth, webapp), LangSmith tracing off."""
    root = str(PROJECT.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    os.environ.setdefault("LANGSMITH_TRACING", "false")
