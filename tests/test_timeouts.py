"""Run timeouts: a run past its time is cancelled for real and ends `timeout`, as on LangGraph's server.

The reference (`BG_JOB_TIMEOUT_SECS=2`, seen by running `langgraph dev`): the run ends `timeout`, counted
from its start; its thread is `error` with `{"error": "TimeoutError", "message": ""}` at its last
checkpoint; waits answer 200 with the thread's values; the stream ends without an `error` event.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import PROJECT
from tests.project.agents import WORK_LOG
from tests.services import Backend
from tests.waits import agent_stopped

TIMEOUT = {"configurable": {"run_timeout_seconds": 0.3}}


def _done(tag: str) -> int:
    return sum(1 for entry in WORK_LOG if entry.startswith(f"{tag}:"))


async def _finished(http: httpx.AsyncClient, tid: str, run_id: str) -> dict[str, Any]:
    joined = await http.get(f"/threads/{tid}/runs/{run_id}/join")
    assert joined.status_code == 200
    return (await http.get(f"/threads/{tid}/runs/{run_id}")).json()


async def test_a_run_past_its_timeout_ends_timeout_and_its_agent_stops(http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    waited = await http.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": "slow", "input": {"tag": "t1", "steps": 200, "delay": 0.05}, "config": TIMEOUT})
    assert waited.status_code == 200
    assert waited.json()["tag"] == "t1" and not waited.json().get("done")  # the values at its last checkpoint
    run = (await http.get(f"/threads/{tid}/runs")).json()[0]
    assert run["status"] == "timeout"
    thread = (await http.get(f"/threads/{tid}")).json()
    assert thread["status"] == "error"
    assert thread["error"] == {"error": "TimeoutError", "message": ""}
    stopped_at = _done("t1")
    assert stopped_at < 200
    await agent_stopped("t1")
    assert _done("t1") == stopped_at  # the agent's task stopped: no more work after the end
    metrics = (await http.get("/metrics")).text
    assert 'lg_api_runs_finished_total{status="timeout"} 1.0' in metrics
    # The thread takes a new run.
    again = await http.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": "slow", "input": {"tag": "t1b", "steps": 1, "delay": 0}})
    assert again.json()["done"] == ["t1b"]


async def test_a_timed_out_stream_ends_without_an_error_event(http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    events = []
    async with http.stream("POST", f"/threads/{tid}/runs/stream", json={
            "assistant_id": "slow", "input": {"tag": "t2", "steps": 200, "delay": 0.05},
            "stream_mode": ["custom"], "config": TIMEOUT}) as response:
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
    assert events[0] == "metadata" and "custom" in events
    assert "error" not in events
    run = (await http.get(f"/threads/{tid}/runs")).json()[0]
    assert run["status"] == "timeout"


async def test_an_assistants_config_sets_the_timeout_of_its_runs(http: httpx.AsyncClient) -> None:
    assistant = (await http.post("/assistants", json={"graph_id": "slow", "config": TIMEOUT})).json()
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    run = (await http.post(f"/threads/{tid}/runs", json={
        "assistant_id": assistant["assistant_id"], "input": {"tag": "t3", "steps": 200, "delay": 0.05}})).json()
    assert (await _finished(http, tid, run["run_id"]))["status"] == "timeout"
    # A run's own config overrides its assistant's.
    run = (await http.post(f"/threads/{tid}/runs", json={
        "assistant_id": assistant["assistant_id"], "input": {"tag": "t3b", "steps": 3, "delay": 0.2},
        "config": {"configurable": {"run_timeout_seconds": 60}}})).json()
    assert (await _finished(http, tid, run["run_id"]))["status"] == "success"


async def test_a_timed_out_synchronous_node_ends_the_run_only_once_its_thread_returned(
        http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    waited = await http.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": "slow_sync", "input": {"tag": "t4", "steps": 4, "delay": 0.2}, "config": TIMEOUT})
    assert waited.status_code == 200
    # The node's thread cannot be stopped: the run ended after it returned, as a cancel does.
    assert _done("t4") == 4
    assert (await http.get(f"/threads/{tid}/runs")).json()[0]["status"] == "timeout"


@pytest.mark.parametrize("bad", [0, -1, "soon", True])
async def test_a_bad_run_timeout_is_a_422(http: httpx.AsyncClient, bad: Any) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    response = await http.post(f"/threads/{tid}/runs", json={
        "assistant_id": "slow", "config": {"configurable": {"run_timeout_seconds": bad}}})
    assert response.status_code == 422
    assert "run_timeout_seconds" in response.json()["detail"]


# --- the deadline outlives the process that started the run -------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(backend: Backend, tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {**os.environ, **backend.env(), "PYTHONPATH": str(Path(__file__).parents[1]),
           "THREADLINE_LEASE_SECONDS": "2", "THREADLINE_RUN_RETRIES": "3", "LANGSMITH_TRACING": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "threadline", "serve", "--config", str(PROJECT),
                             "--port", str(port), "--workers", "2"],
                            stdout=(tmp / f"{name}.log").open("ab"), stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp / f"{name}.log").read_text()
        try:
            if httpx.get(f"{base}/ok", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError((tmp / f"{name}.log").read_text())


def _deadline_passed(backend: Backend, base: str, tid: str, run_id: str) -> bool:
    """Whether the run's stored deadline has passed (on the database's clock for PostgreSQL)."""
    if backend.kind == "sqlite":
        import sqlite3
        with sqlite3.connect(backend.database_url.removeprefix("sqlite:///")) as conn:
            row = conn.execute("SELECT deadline_at FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        from datetime import datetime
        return bool(row and row[0]) and datetime.fromisoformat(row[0]) < datetime.now(UTC)
    with psycopg.connect(backend.database_url) as conn:
        found = conn.execute("SELECT deadline_at < now() FROM runs WHERE run_id = %s", (run_id,)).fetchone()
    return bool(found and found[0])


def _attempts(backend: Backend, run_id: str) -> int:
    if backend.kind == "sqlite":
        import sqlite3
        with sqlite3.connect(backend.database_url.removeprefix("sqlite:///")) as conn:
            return int(conn.execute("SELECT attempt FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0])
    with psycopg.connect(backend.database_url) as conn:
        found = conn.execute("SELECT attempt FROM runs WHERE run_id = %s", (run_id,)).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.e2e  # real server processes, one of them killed
def test_the_deadline_holds_when_the_process_that_started_the_run_dies(backend: Backend, tmp_path: Path) -> None:
    """Killed mid-run, past its deadline when a process next looks (at its start, or its sweeper): the run
    ends `timeout`, not retried (run_retries=3 would retry it), and its thread is usable."""
    first, base = _serve(backend, tmp_path, "first")
    second = None
    try:
        tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
        run_id = httpx.post(f"{base}/threads/{tid}/runs", json={
            "assistant_id": "slow", "input": {"tag": "k", "steps": 400, "delay": 0.05},
            "config": {"configurable": {"run_timeout_seconds": 2}}}).json()["run_id"]
        limit = time.monotonic() + 30
        while httpx.get(f"{base}/threads/{tid}/runs/{run_id}").json()["status"] != "running":
            assert time.monotonic() < limit, "the run never started"
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        while not _deadline_passed(backend, base, tid, run_id):
            assert time.monotonic() < limit, "the deadline never passed"
            time.sleep(0.1)
        second, base = _serve(backend, tmp_path, "second")
        joined = httpx.get(f"{base}/threads/{tid}/runs/{run_id}/join", timeout=60)
        assert joined.status_code == 200
        run = httpx.get(f"{base}/threads/{tid}/runs/{run_id}").json()
        assert run["status"] == "timeout"
        assert _attempts(backend, run_id) == 1  # ended by the sweep, never started again
        thread = httpx.get(f"{base}/threads/{tid}").json()
        assert thread["status"] == "error" and thread["error"]["error"] == "TimeoutError"
        assert 'lg_api_runs_finished_total{status="timeout"} 1.0' in httpx.get(f"{base}/metrics").text
        again = httpx.post(f"{base}/threads/{tid}/runs/wait", json={
            "assistant_id": "slow", "input": {"tag": "after", "steps": 1, "delay": 0}}, timeout=30)
        assert again.status_code == 200 and again.json()["done"] == ["after"]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_langgraphs_bg_job_timeout_secs_is_honoured_below_ours() -> None:
    from threadline.settings import Settings

    assert Settings.resolve(environ={}).run_timeout_seconds == 86400
    assert Settings.resolve(environ={"BG_JOB_TIMEOUT_SECS": "120"}).run_timeout_seconds == 120
    both = {"BG_JOB_TIMEOUT_SECS": "120", "THREADLINE_RUN_TIMEOUT_SECONDS": "30"}
    assert Settings.resolve(environ=both).run_timeout_seconds == 30
    assert Settings.resolve({"run_timeout_seconds": 5.0}, environ=both).run_timeout_seconds == 5


async def test_the_server_default_times_runs_out(backend: Backend) -> None:
    from asgi_lifespan import LifespanManager

    from threadline.api.app import create_app
    from threadline.settings import Settings

    app = create_app(Settings(config=str(PROJECT), workers=2, run_timeout_seconds=0.3, **backend.settings()))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://t",
                                     timeout=30) as http:
            response = await http.post("/runs/wait", json={
                "assistant_id": "slow", "input": {"tag": "t6", "steps": 200, "delay": 0.05}})
            assert response.status_code == 200
            runs = (await http.post("/runs/search", json={"limit": 5})).json()
            assert [r["status"] for r in runs] == ["timeout"]
