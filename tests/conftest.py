"""Fixtures: the app in-process over each backend, and langgraph-sdk / raw HTTP clients against it."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient

from threadline.api.app import create_app
from threadline.settings import Settings

PROJECT = Path(__file__).parent / "project" / "langgraph.json"
BACKENDS = ["sqlite"]


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'threadline.db'}"
    raise AssertionError(request.param)


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(config=str(PROJECT), database_url=database_url, workers=4, heartbeat_seconds=5.0)


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[object]:
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        yield manager.app


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
