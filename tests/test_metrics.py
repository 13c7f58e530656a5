"""GET /metrics: Prometheus text by default, JSON with ?format=json, scraped while runs execute."""

from __future__ import annotations

import asyncio

import httpx
from langgraph_sdk.client import LangGraphClient
from prometheus_client.parser import text_string_to_metric_families

from tests.waits import logged, until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
LONG = {"steps": 10_000, "delay": 0.02}  # a `slow` run that lasts until it is cancelled


async def scrape(http: httpx.AsyncClient) -> Samples:
    r = await http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_queue_running_and_finished_runs_move(http: httpx.AsyncClient, sdk: LangGraphClient) -> None:
    before = await scrape(http)
    assert value(before, "lg_api_workers_max") == 4 and value(before, "lg_api_num_running_runs") == 0
    tid = (await sdk.threads.create())["thread_id"]
    running = await sdk.runs.create(tid, "slow", input={"tag": "m1", **LONG})
    # Same thread, enqueued: it waits for the first one, so the queue visibly holds it.
    queued = await sdk.runs.create(tid, "slow", input={"tag": "m2", "steps": 1, "delay": 0.01})

    async def both_visible() -> Samples | None:
        # The counts come from storage, the active slots from the pool: a run is recorded running when it is
        # claimed, a moment before its slot counts it active (seen under load), so all three are waited for.
        s = await scrape(http)
        seen = (value(s, "lg_api_num_running_runs") >= 1 and value(s, "lg_api_num_pending_runs") >= 1
                and value(s, "lg_api_workers_active") >= 1)
        return s if seen else None

    during = await until(both_visible)
    assert value(during, "lg_api_workers_available") == 4 - value(during, "lg_api_workers_active")
    assert 0 < value(during, "lg_api_workers_saturation") <= 1
    assert value(during, "lg_api_pending_runs_wait_time_max") >= 0

    await sdk.runs.cancel(tid, running["run_id"], wait=True)
    await sdk.runs.join(tid, queued["run_id"])
    await sdk.runs.wait(None, "failing", input={"reason": "for the error count"}, raise_error=False)
    after = await until(lambda: _settled(http))
    finished = "lg_api_runs_finished_total"
    for status in ("interrupted", "success", "error"):
        assert value(after, finished, status=status) == value(before, finished, status=status) + 1, status
    assert value(after, finished, status="timeout") == 0
    assert value(after, "lg_api_run_duration_seconds_count") == value(before, "lg_api_run_duration_seconds_count") + 3


async def _settled(http: httpx.AsyncClient) -> Samples | None:
    s = await scrape(http)
    idle = value(s, "lg_api_num_running_runs") == 0 and value(s, "lg_api_num_pending_runs") == 0
    return s if idle and value(s, "lg_api_workers_active") == 0 else None


async def test_requests_are_counted_by_route_template(http: httpx.AsyncClient) -> None:
    ids = [(await http.post("/threads", json={})).json()["thread_id"] for _ in range(3)]
    for tid in ids:
        assert (await http.get(f"/threads/{tid}")).status_code == 200
    assert (await http.get("/threads/00000000-0000-0000-0000-000000000000")).status_code == 404
    await http.get("/no/such/path")
    s = await scrape(http)
    requests = "lg_api_http_requests_total"
    assert value(s, requests, method="GET", path="/threads/{thread_id}", status="200") == 3
    assert value(s, requests, method="GET", path="/threads/{thread_id}", status="404") == 1
    assert value(s, requests, method="POST", path="/threads", status="200") == 3
    assert value(s, requests, method="GET", path="unmatched", status="404") == 1
    assert value(s, "lg_api_http_requests_latency_seconds_count", method="GET", path="/threads/{thread_id}") == 4
    paths = {dict(labels).get("path") for name, labels in s if name == requests}
    assert not any(tid in (p or "") for p in paths for tid in ids)  # raw paths never become labels


async def test_docs_and_openapi_are_counted_under_their_paths(http: httpx.AsyncClient) -> None:
    for path in ("/docs", "/openapi.json", "/docs/assets/swagger-ui.css", "/redoc"):
        assert (await http.get(path)).status_code == 200, path
    s = await scrape(http)
    requests = "lg_api_http_requests_total"
    for path in ("/docs", "/openapi.json", "/docs/assets", "/redoc"):
        assert value(s, requests, method="GET", path=path, status="200") == 1, path
    assert value(s, requests, method="GET", path="unmatched", status="200") == 0


async def test_json_format(http: httpx.AsyncClient, sdk: LangGraphClient) -> None:
    await sdk.runs.wait(None, "counter", input={"increment": 1})
    r = await http.get("/metrics", params={"format": "json"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["queue"].keys() == {"n_pending", "n_running", "pending_runs_wait_time_max"}
    assert body["workers"] == {"max": 4, "active": 0, "available": 4, "saturation": 0.0}
    assert body["runs"]["finished"]["success"] == 1 and body["runs"]["duration_seconds"]["count"] == 1
    assert {"method": "POST", "path": "/runs/wait", "status": "200", "count": 1} in body["api"]["http_requests_total"]
    assert body["streams"] == {"subscribers": 0}
    # An unknown format is the Prometheus text, as the reference.
    assert (await http.get("/metrics", params={"format": "xml"})).headers["content-type"].startswith("text/plain")


async def test_open_streams_are_counted(http: httpx.AsyncClient, sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    run = await sdk.runs.create(tid, "slow", input={"tag": "s", **LONG})
    joined = asyncio.create_task(http.get(f"/threads/{tid}/runs/{run['run_id']}/stream"))

    async def subscribed() -> bool:
        return value(await scrape(http), "lg_api_stream_subscribers") == 1

    await until(subscribed)
    await sdk.runs.cancel(tid, run["run_id"], wait=True)
    assert (await joined).status_code == 200
    assert value(await scrape(http), "lg_api_stream_subscribers") == 0


async def test_info_lists_enabled_surfaces(http: httpx.AsyncClient) -> None:
    flags = (await http.get("/info")).json()["flags"]
    assert flags["metrics"] is True and flags["mcp"] is True and flags["a2a"] is True
    assert flags["streaming_protocol"] is True
    assert flags["crons"] is True  # served (tests/test_crons.py)


async def test_a_client_that_leaves_a_wait_is_counted_as_499(live_url: str) -> None:
    """Nobody reads the answer of a wait whose client left; the request is still counted, as 499."""
    from tests.project.agents import WORK_LOG

    async with httpx.AsyncClient(base_url=live_url, timeout=30) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        waiting = asyncio.create_task(http.post(f"/threads/{tid}/runs/wait", json={
            "assistant_id": "slow", "input": {"tag": "gone499", "steps": 200, "delay": 0.02},
            "on_disconnect": "cancel"}))
        await until(logged(WORK_LOG, "gone499:"))
        waiting.cancel()

        async def counted() -> Samples | None:
            s = await scrape(http)
            labels = {"method": "POST", "path": "/threads/{thread_id}/runs/wait", "status": "499"}
            return s if value(s, "lg_api_http_requests_total", **labels) == 1 else None

        s = await until(counted)
        assert value(s, "lg_api_http_requests_total", method="POST", path="/threads/{thread_id}/runs/wait",
                     status="200") == 0
