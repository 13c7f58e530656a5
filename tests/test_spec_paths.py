"""The Agent Protocol's own paths, through raw HTTP, over the same core as LangGraph's."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.shared_app import shared_app
from tests.waits import until

# The module's tests share one started app per backend (tests/conftest.py, `module_served`): each makes what it
# reads, under ids of its own. They run in the app's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http = shared_app()



async def _thread(http: httpx.AsyncClient) -> str:
    return (await http.post("/threads", json={})).json()["thread_id"]


async def test_create_get_wait_search_delete(http: httpx.AsyncClient) -> None:
    tid = await _thread(http)
    r = await http.post("/runs", json={"thread_id": tid, "agent_id": "counter", "input": {"increment": 2},
                                       "metadata": {"src": "spec"}})
    assert r.status_code == 200
    run = r.json()
    assert run["agent_id"] == run["assistant_id"] and run["thread_id"] == tid and run["status"] == "pending"
    assert run["input"] == {"increment": 2}
    waited = (await http.get(f"/runs/{run['run_id']}/wait")).json()
    assert waited["run"]["status"] == "success" and waited["values"]["count"] == 2
    got = (await http.get(f"/runs/{run['run_id']}")).json()
    assert got["status"] == "success"
    found = (await http.post("/runs/search", json={"thread_id": tid, "metadata": {"src": "spec"}})).json()
    assert [f["run_id"] for f in found] == [run["run_id"]]
    assert (await http.post("/runs/search", json={"status": "success", "agent_id": run["agent_id"]})).json()
    assert (await http.delete(f"/runs/{run['run_id']}")).status_code == 204
    assert (await http.get(f"/runs/{run['run_id']}")).status_code == 404


async def test_stateless_run_keeps_its_record(http: httpx.AsyncClient) -> None:
    r = await http.post("/runs/wait", json={"agent_id": "counter", "input": {"increment": 5}})
    body = r.json()
    assert r.status_code == 200 and body["values"]["count"] == 5 and body["run"]["status"] == "success"
    # The temporary thread is gone, the run's record and output stay.
    assert (await http.get(f"/threads/{body['run']['thread_id']}")).status_code == 404
    again = (await http.get(f"/runs/{body['run']['run_id']}/wait")).json()
    assert again["values"]["count"] == 5


async def test_on_completion_keep(http: httpx.AsyncClient) -> None:
    r = await http.post("/runs", json={"assistant_id": "counter", "input": {}, "on_completion": "keep"})
    run = r.json()
    await http.get(f"/runs/{run['run_id']}/wait")
    thread = (await http.get(f"/threads/{run['thread_id']}")).json()
    assert thread["values"]["count"] == 1


async def test_cancel_and_stream_join(http: httpx.AsyncClient) -> None:
    tid = await _thread(http)
    # Long enough (20 s) to be still running when the cancel comes on a loaded machine: the cancel ends it.
    run = (await http.post("/runs", json={"thread_id": tid, "agent_id": "slow",
                                          "input": {"steps": 1000, "delay": 0.02}})).json()
    await until(lambda: _status_is(http, run["run_id"], "running"), what="the run to be running")
    r = await http.post(f"/runs/{run['run_id']}/cancel", params={"wait": "true"})
    assert r.status_code == 204
    assert (await http.get(f"/runs/{run['run_id']}")).json()["status"] == "interrupted"
    # Joining the finished run's stream with Last-Event-ID replays what came after it.
    r = await http.get(f"/runs/{run['run_id']}/stream", headers={"Last-Event-ID": "0-0"})
    assert r.status_code == 200 and "text/event-stream" in r.headers["content-type"]
    assert "event: metadata" in r.text


async def test_run_errors(http: httpx.AsyncClient) -> None:
    assert (await http.get(f"/runs/{uuid.uuid4()}")).status_code == 404
    assert (await http.get("/runs/not-a-uuid")).status_code == 422
    r = await http.post("/runs", json={"thread_id": str(uuid.uuid4()), "agent_id": "echo", "input": {}})
    assert r.status_code == 404
    r = await http.post("/runs/search", json={"limit": 5000})
    assert r.status_code == 422 and "limit" in r.json()["detail"]
    r = await http.post("/runs/cancel", json={})
    assert r.status_code == 422
    r = await http.post("/runs/cancel", json={"run_ids": [str(uuid.uuid4())]})
    assert r.status_code == 404
    tid = await _thread(http)
    run = (await http.post(f"/threads/{tid}/runs", json={"assistant_id": "slow",
                                                         "input": {"steps": 1000, "delay": 0.02}})).json()
    r = await http.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", "input": {},
                                                      "multitask_strategy": "reject"})
    assert r.status_code == 409 and r.json()["code"] == "conflict"
    r = await http.post("/runs/cancel", json={"thread_id": tid, "run_ids": [run["run_id"]]})
    assert r.status_code == 204


async def test_batch(http: httpx.AsyncClient) -> None:
    r = await http.post("/runs/batch", json=[{"assistant_id": "counter", "input": {}, "on_completion": "keep"},
                                             {"assistant_id": "echo", "input": {"message": "x"}}])
    assert r.status_code == 200 and [x["status"] for x in r.json()] == ["pending", "pending"]
    r = await http.post("/runs/batch", json=[{"assistant_id": "counter", "stream_mode": 5}])
    assert r.status_code == 422


async def _status_is(http: httpx.AsyncClient, run_id: str, status: str) -> bool:
    return bool((await http.get(f"/runs/{run_id}")).json()["status"] == status)
