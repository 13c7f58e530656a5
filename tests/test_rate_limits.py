"""Rate limits per identity: a spent budget answers 429 with Retry-After and RateLimit headers, refills,
and is shared by every API process on PostgreSQL + Redis and on PostgreSQL alone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from tests.conftest import PROJECT
from tests.services import Backend, ScaleOut
from tests.waits import until, until_sync
from threadline.api.app import create_app
from threadline.settings import Settings


async def _client(backend: Backend, **limits: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(config=str(PROJECT), workers=2, **backend.settings(), **limits))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://t",
                                     timeout=30) as http:
            yield http


@pytest.fixture
async def limited(backend: Backend) -> AsyncIterator[httpx.AsyncClient]:
    async for http in _client(backend, rate_limit_runs="3/second", rate_limit_requests="5/second"):
        yield http


async def test_a_spent_run_budget_answers_429_and_refills(limited: httpx.AsyncClient) -> None:
    tid = (await limited.post("/threads", json={})).json()["thread_id"]
    body = {"assistant_id": "echo", "input": {"messages": []}}
    answers = [await limited.post(f"/threads/{tid}/runs", json=body) for _ in range(6)]
    refused = [r for r in answers if r.status_code == 429]
    assert [r.status_code for r in answers[:3]] == [200, 200, 200] and refused
    first = refused[0]
    assert "rate limit" in first.json()["detail"].lower()
    retry = int(first.headers["retry-after"])
    assert retry >= 1
    assert first.headers["ratelimit-limit"] == "3"
    assert int(first.headers["ratelimit-remaining"]) == 0
    assert int(first.headers["ratelimit-reset"]) >= 1
    # Reads draw on the other budget, and health is never limited.
    assert (await limited.get(f"/threads/{tid}")).status_code == 200
    for _ in range(20):
        assert (await limited.get("/ok")).status_code == 200
    metrics = (await limited.get("/metrics")).text
    assert 'lg_api_rate_limited_requests_total{budget="runs",path="/threads/{thread_id}/runs"}' in metrics
    # Once the window has passed (Retry-After at most), the budget is there again: asked until it is (a refused
    # creation spends nothing), not slept past.
    async def created() -> bool:
        return (await limited.post(f"/threads/{tid}/runs", json=body)).status_code == 200

    await until(created, timeout=retry + 10, interval=0.1, what="the run budget to refill")


async def test_the_request_budget_limits_reads(limited: httpx.AsyncClient) -> None:
    codes = [(await limited.get("/assistants/search")).status_code for _ in range(8)]  # GET: not a route
    codes += [(await limited.post("/assistants/search", json={})).status_code for _ in range(8)]
    assert 429 in codes and codes.count(429) < len(codes)


# Budgets per day where a test spends one and expects the refusal: the sliding window counter weighs the
# previous window's hits down as the current one goes on, so a per-minute budget spent across a minute's
# boundary can allow one more (it did once, in the refused-credentials test, on a loaded machine).


async def test_x_forwarded_for_counts_only_from_a_trusted_proxy(backend: Backend) -> None:
    async for http in _client(backend, rate_limit_requests="2/day", trusted_proxies="127.0.0.1"):
        # httpx's ASGI transport presents the peer as 127.0.0.1: a trusted proxy, so each forwarded
        # client has its own budget.
        for client in ("10.0.0.1", "10.0.0.2"):
            codes = [(await http.post("/threads/search", json={}, headers={"X-Forwarded-For": client})).status_code
                     for _ in range(2)]
            assert codes == [200, 200]
        assert (await http.post("/threads/search", json={},
                                headers={"X-Forwarded-For": "10.0.0.1"})).status_code == 429
    async for http in _client(backend, rate_limit_requests="2/day"):
        # No trusted proxy: the header is the client's own word, and ignored.
        codes = [(await http.post("/threads/search", json={}, headers={"X-Forwarded-For": f"10.0.0.{i}"})
                  ).status_code for i in range(3)]
        assert codes == [200, 200, 429]


def test_a_bad_budget_stops_startup() -> None:
    from threadline.api.ratelimit import RateLimiter
    from threadline.errors import ConfigError

    with pytest.raises(ConfigError, match="rate_limit_runs"):
        RateLimiter("lots", "")


# --- one budget across two API processes ----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _api(backend: Backend, tmp: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    log = tmp / f"api-{port}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "threadline", "serve", "--config", str(PROJECT), "--port", str(port), "--workers", "0"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT,
        env={**os.environ, **backend.env(), **env, "PYTHONPATH": str(Path(__file__).parents[1])})
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"{base}/ok", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        until_sync(answers, timeout=60, interval=0.1, what=f"the API process on port {port} to answer /ok")
    except BaseException:
        proc.kill()
        print(log.read_text())  # shown with the failure
        raise
    return proc, base


@pytest.mark.e2e  # two real API processes on one PostgreSQL, with Redis or alone (then it counts the budgets)
@pytest.mark.parametrize("broker", ["redis", "postgres"])
def test_the_budget_is_shared_by_every_api_process(scaleout_services: ScaleOut, tmp_path: Path, broker: str) -> None:
    backend = scaleout_services.fresh()
    if broker == "postgres":
        backend = Backend("postgres", backend.database_url)
    elif not backend.redis_url:
        pytest.skip("THREADLINE_TEST_REDIS=memory: no Redis")
    env = {"THREADLINE_RATE_LIMIT_RUNS": "4/day"}
    procs = [_api(backend, tmp_path, env), _api(backend, tmp_path, env)]
    try:
        (_, a), (_, b) = procs
        tid = httpx.post(f"{a}/threads", json={}).json()["thread_id"]
        body = {"assistant_id": "echo", "input": {"messages": []}}
        codes = [httpx.post(f"{base}/threads/{tid}/runs", json=body).status_code for base in (a, b, a, b, a, b)]
        # Four in all, wherever they were sent: each process alone would have allowed four.
        assert codes == [200, 200, 200, 200, 429, 429]
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(15)


def test_the_identity_is_the_authenticated_caller_once_there_is_one() -> None:
    from types import SimpleNamespace

    from starlette.requests import Request

    from threadline.api.ratelimit import identity_of

    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/", "headers": [], "client": ("10.1.2.3", 5000)}
    assert identity_of(Request(scope)) == "ip:10.1.2.3"
    scope["threadline.auth_user"] = SimpleNamespace(identity="alice")
    assert identity_of(Request(scope)) == "user:alice"


# --- who a request counts against once authentication is on ------------------------------------------
ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"


async def test_authenticated_callers_draw_on_their_own_budgets_from_one_address(backend: Backend) -> None:
    """The limiter runs inside authentication: two users behind one address (one NAT, one proxy) are each
    limited on their own, not together as the address."""
    async for http in _client(backend, rate_limit_requests="3/day", api_keys=f"alice={ALICE},bob={BOB}"):
        def search(key: str) -> Any:
            return http.post("/threads/search", json={}, headers={"x-api-key": key})  # noqa: B023 - this iteration's

        assert [(await search(ALICE)).status_code for _ in range(4)] == [200, 200, 200, 429]
        assert [(await search(BOB)).status_code for _ in range(3)] == [200, 200, 200]


async def test_refused_credentials_spend_the_address_budget_not_the_users(backend: Backend) -> None:
    """A request whose credentials are refused counts against its address; once the address has spent its
    budget, its requests are refused (429) before they are authenticated. Authenticated requests from the
    same address never spent it, and another address is not affected."""
    async for http in _client(backend, rate_limit_requests="3/day", api_keys=f"alice={ALICE}",
                              trusted_proxies="127.0.0.1"):
        def search(key: str, client: str) -> Any:
            # B023: called only inside this iteration (the loop runs once, with the one client)
            return http.post("/threads/search", json={}, headers={"x-api-key": key, "X-Forwarded-For": client})  # noqa: B023

        # Alice's own budget, from 10.0.0.1: spent without touching the address's.
        assert [(await search(ALICE, "10.0.0.1")).status_code for _ in range(3)] == [200, 200, 200]
        # Wrong keys from 10.0.0.1: three 401s spend the address's budget, then 429 before authentication.
        codes = [(await search("wrong-key-0123456789abcdef", "10.0.0.1")).status_code for _ in range(5)]
        assert codes == [401, 401, 401, 429, 429]
        refused = await search("wrong-key-0123456789abcdef", "10.0.0.1")
        assert refused.status_code == 429 and refused.headers["retry-after"]
        # Another address is still asked for its credentials.
        assert (await search("wrong-key-0123456789abcdef", "10.0.0.2")).status_code == 401


async def test_refused_credentials_are_throttled_by_default(backend: Backend) -> None:
    """With no rate limit set, refused credentials still spend their address's own budget
    (`rate_limit_auth_failures`, 20/minute by default): then 429 before authentication, the right key included.
    Authenticated requests never spend it; another address is still asked. The budget is the default's count
    per day here (see above: a minute's boundary in the middle let one more through on a loaded CI machine)."""
    assert Settings().rate_limit_auth_failures == "20/minute"
    async for http in _client(backend, api_keys=f"alice={ALICE}", trusted_proxies="127.0.0.1",
                              rate_limit_auth_failures="20/day"):
        def search(key: str, client: str) -> Any:
            # B023: called only inside this iteration (the loop runs once, with the one client)
            return http.post("/threads/search", json={}, headers={"x-api-key": key, "X-Forwarded-For": client})  # noqa: B023

        assert {(await search(ALICE, "10.0.0.1")).status_code for _ in range(25)} == {200}
        codes = [(await search("wrong-key-0123456789abcdef", "10.0.0.1")).status_code for _ in range(21)]
        assert codes == [401] * 20 + [429]
        refused = await search(ALICE, "10.0.0.1")
        assert refused.status_code == 429 and refused.headers["retry-after"]
        assert refused.json()["detail"].startswith("Rate limit exceeded for failed authentication (20 per 1 day)")
        assert (await search("wrong-key-0123456789abcdef", "10.0.0.2")).status_code == 401
        assert (await search(ALICE, "10.0.0.2")).status_code == 200


async def test_a_console_page_costs_its_caller_one_request(backend: Backend) -> None:
    """A console page reads through the API in-process (five calls for a thread page): the page spends one unit
    of its caller's request budget, and its calls none, so a tight budget does not make the console refuse
    itself."""
    async for http in _client(backend, rate_limit_requests="2/day", trusted_proxies="127.0.0.1"):
        setup, browser = {"X-Forwarded-For": "10.0.0.1"}, {"X-Forwarded-For": "10.0.0.9"}
        tid = (await http.post("/threads", json={}, headers=setup)).json()["thread_id"]
        pages = [await http.get(f"/console/threads/{tid}", headers=browser) for _ in range(3)]
        assert [p.status_code for p in pages] == [200, 200, 429]
        assert all(tid in p.text and "Rate limit" not in p.text for p in pages[:2])
        # Another client still has its own budget.
        assert (await http.get(f"/threads/{tid}", headers=setup)).status_code == 200
