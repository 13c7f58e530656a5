"""Stopping: however many SIGINT / SIGTERM arrive, `threadline serve` and `threadline worker` end in bounded
time, the embedded database is free for the next start, and runs in flight are not lost. Streams open at
the stop end cleanly and tell their clients to reconnect; their runs go back to the queue."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.services import ScaleOut
from tests.test_restart import _free_port, _start, _wait_running
from tests.test_scaleout import Cluster, _wait_status

EXIT_WITHIN = 15.0  # seconds from the first signal
SEQUENCES = {
    "sigint-x2": [signal.SIGINT] * 2,
    "sigint-x3": [signal.SIGINT] * 3,
    "sigterm": [signal.SIGTERM],
}
SLOW = {"assistant_id": "slow", "input": {"tag": "s", "steps": 60, "delay": 0.05}}


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
