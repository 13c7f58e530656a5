"""Stopping: however many SIGINT / SIGTERM arrive, `threadline serve` and `threadline worker` end in bounded
time, the embedded database is free for the next start, and runs in flight are not lost. Streams open at
the stop end cleanly and tell their clients to reconnect; their runs go back to the queue."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client

from tests.conftest import serving_asgi
from tests.services import ScaleOut
from tests.test_restart import _free_port, _start, _wait_running
from tests.test_scaleout import Cluster, _wait_status
from threadline.api.app import create_app
from threadline.api.sse import RECONNECT
from threadline.settings import Settings
from threadline.storage import open_storage

EXIT_WITHIN = 15.0  # seconds from the first signal
SEQUENCES = {
    "sigint-x2": [signal.SIGINT] * 2,
    "sigint-x3": [signal.SIGINT] * 3,
    "sigterm": [signal.SIGTERM],
}
SLOW: dict[str, Any] = {"assistant_id": "slow", "input": {"tag": "s", "steps": 60, "delay": 0.05}}


def _signal_and_wait(proc: subprocess.Popen, signals: list[signal.Signals], log: Path) -> float:
    """Send `signals` 50 ms apart; the seconds until the process ended (it must, within EXIT_WITHIN)."""
    started = time.monotonic()
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.05)
    try:
        proc.wait(EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"still running {EXIT_WITHIN} s after {signals}:\n{log.read_text()[-4000:]}") from None
    return time.monotonic() - started


@pytest.mark.e2e  # a real server process, signalled
@pytest.mark.parametrize("signals", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_serve_stops_mid_run_and_the_next_start_finishes_the_run(tmp_path: Path, signals: list) -> None:
    db, log = tmp_path / "t.db", tmp_path / "server.log"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(db, port, log)
    try:
        tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
        run_id = httpx.post(f"{base}/threads/{tid}/runs", json=SLOW).json()["run_id"]
        _wait_running(base, tid, run_id)
        _signal_and_wait(proc, signals, log)
        proc = _start(db, port, log)  # the database's lock was released: the next start is not refused
        joined = httpx.get(f"{base}/threads/{tid}/runs/{run_id}/join", timeout=60)
        assert joined.status_code == 200 and joined.json()["done"] == ["s"]
        assert httpx.get(f"{base}/threads/{tid}/runs/{run_id}").json()["status"] == "success"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("signals", SEQUENCES.values(), ids=SEQUENCES.keys())
@pytest.mark.e2e  # API and worker processes, a worker signalled
def test_worker_stops_mid_run_and_another_worker_finishes_the_run(scaleout_services: ScaleOut, tmp_path: Path,
                                                                  signals: list) -> None:
    cluster = Cluster(scaleout_services.fresh(), tmp_path)
    try:
        worker = cluster.start_worker()
        base = cluster.start_api()
        tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
        run_id = httpx.post(f"{base}/threads/{tid}/runs", json=SLOW).json()["run_id"]
        _wait_status(base, tid, run_id, {"running"})
        _signal_and_wait(worker, signals, tmp_path / "worker-0.log")
        if len(signals) < 3:  # a graceful stop puts the run back in the queue at once
            assert httpx.get(f"{base}/threads/{tid}/runs/{run_id}").json()["status"] == "pending"
        cluster.start_worker()  # after a third signal, the run comes back when its lease lapses
        joined = httpx.get(f"{base}/threads/{tid}/runs/{run_id}/join", timeout=60)
        assert joined.status_code == 200 and joined.json()["done"] == ["s"], cluster.logs()
        assert httpx.get(f"{base}/threads/{tid}/runs/{run_id}").json()["status"] == "success"
    finally:
        cluster.close()


async def test_a_stream_open_at_shutdown_ends_with_reconnect_and_its_run_goes_back_to_the_queue(
        settings: Settings) -> None:
    app = create_app(settings)
    async with serving_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        tid = (await client.post("/threads", json={})).json()["thread_id"]
        body = {**SLOW, "stream_mode": ["custom"]}
        async with client.stream("POST", f"/threads/{tid}/runs/stream", json=body) as response:
            location = response.headers["location"]
            received = b""
            chunks = response.aiter_bytes()
            async with asyncio.timeout(20):
                while b"event: custom" not in received:
                    received += await anext(chunks)
                # What the first SIGINT / SIGTERM does (threadline/shutdown.py), before the lifespan ends.
                app.state.runtime.draining.set()
                async for chunk in chunks:  # the response completes: no ReadError, no cut response
                    received += chunk
        run_id = location.split("/runs/")[1].split("/")[0]
    assert received.endswith(RECONNECT)
    assert b"event: end" not in received and b"event: error" not in received
    storage = await open_storage(settings.database_url)
    try:
        run = await storage.get_run(run_id)
        thread = await storage.get_thread(tid)
    finally:
        await storage.close()
    assert run is not None and run["status"] == "pending" and run["attempt"] == 0  # not "interrupted"
    assert thread is not None and thread.get("error") is None


@pytest.mark.e2e  # a real server process, restarted
def test_an_sdk_stream_continues_across_a_restart(tmp_path: Path) -> None:
    """langgraph-sdk reconnects to the stream's Location with Last-Event-ID when it closes without an end, as
    it does when the server restarts: its loop sees the run through to its end."""
    db, log = tmp_path / "t.db", tmp_path / "server.log"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(db, port, log)
    try:
        tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
        parts: list[tuple[str, object]] = []
        first = threading.Event()

        async def follow() -> None:
            client = get_client(url=base)
            async for part in client.runs.stream(tid, "slow", input=SLOW["input"],
                                                 stream_mode=["custom", "values"]):
                parts.append((part.event, part.data))
                if part.event == "custom":
                    first.set()

        follower = threading.Thread(target=lambda: asyncio.run(follow()), daemon=True)
        follower.start()
        assert first.wait(20), log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(EXIT_WITHIN)
        proc = _start(db, port, log)
        follower.join(60)
        assert not follower.is_alive(), "the SDK's stream never ended"
    finally:
        proc.kill()
        proc.wait(10)
    events = [event for event, _ in parts]
    assert events[0] == "metadata" and "error" not in events
    # The run went back to the queue and ran again on the restarted server: the stream ends on its result.
    assert parts[-1][0] == "values" and json.loads(json.dumps(parts[-1][1]))["done"] == ["s"]
