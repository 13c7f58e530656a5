"""The fixtures of a module whose tests share one started app per backend (`module_served` in conftest.py).

Such a module's tests only read what they made, under ids of their own, and run in the app's event loop:

    pytestmark = pytest.mark.asyncio(loop_scope="module")
    backend, served, http = shared_app()

(`app`, `runtime`, `settings` and `sdk` follow `served` and `http`; `live_url=True` adds the same app over
uvicorn on a loopback port as `live_url`.)
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.services import Backend


def shared_app(*, live_url: bool = False) -> tuple[Any, ...]:
    """`backend`, `served` and `http` (and `live_url`) pointed at the module's shared ones, to assign in the
    module: pytest finds fixtures among a module's names."""

    @pytest.fixture
    def backend(module_backend: Backend) -> Backend:
        return module_backend

    @pytest.fixture
    def served(module_served: tuple[Any, object]) -> tuple[Any, object]:
        return module_served

    @pytest.fixture
    def http(module_http: httpx.AsyncClient) -> httpx.AsyncClient:
        return module_http

    @pytest.fixture
    def live(module_live_url: str) -> str:
        return module_live_url

    return (backend, served, http, live) if live_url else (backend, served, http)
