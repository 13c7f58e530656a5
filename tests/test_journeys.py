"""The seed journeys, replayed literally against the server started with no configuration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager

from tests.hurl import parse, replay
from threadline.api.app import create_app
from threadline.settings import Settings

JOURNEYS = sorted((Path(__file__).parent / "journeys").glob("*.hurl"))
SHARED = Path(__file__).parents[2] / "shared" / "journeys"


@pytest.fixture
async def bare_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """`threadline serve` in an empty folder: no langgraph.json, so the bundled example project."""
    monkeypatch.chdir(tmp_path)
    app = create_app(Settings(database_url=database_url))
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost:8000", timeout=30) as client:
            yield client


@pytest.mark.parametrize("journey", JOURNEYS, ids=lambda p: p.stem)
async def test_journey(bare_http: httpx.AsyncClient, journey: Path) -> None:
    text = journey.read_text()  # noqa: ASYNC240 - a small file, read before any request is sent
    responses = await replay(bare_http, text)
    assert len(responses) == len(parse(text)) > 0


def test_journeys_match_shared_copy() -> None:
    if not SHARED.is_dir():
        pytest.skip("../shared/journeys is not beside this checkout")
    for shared in SHARED.glob("*.hurl"):
        assert (Path(__file__).parent / "journeys" / shared.name).read_text() == shared.read_text(), shared.name
