"""Scale-out end to end: real processes (2 API servers, 2 workers) sharing PostgreSQL and Redis, or
PostgreSQL alone (its own broker).

What a multi-machine deployment must show: a run created on one API process is streamed and resumed
through another; a cancel crosses processes; a worker killed or stalled mid-run loses the run to a live
worker (its late writes refused); a burst of runs each runs exactly once, in order per thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import PROJECT
from tests.services import Backend, ScaleOut

pytestmark = pytest.mark.e2e  # API and worker processes for real

LEASE = "3"  # seconds: short, so lost workers are noticed quickly in tests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """API and worker processes on one backend; logs in `tmp`."""

    def __init__(self, backend: Backend, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.backend = backend
        self.tmp = tmp
        self.env = env or {}  # settings of every process, beside the backend's
        self.apis: list[str] = []
        self.api_procs: dict[str, subprocess.Popen] = {}
        self.workers: dict[int, subprocess.Popen] = {}
        self._procs: list[subprocess.Popen] = []

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        env = {**os.environ, **self.backend.env(), "PYTHONPATH": str(Path(__file__).parents[1]),
               "THREADLINE_LEASE_SECONDS": LEASE, "THREADLINE_RUN_RETRIES": "1", "LANGSMITH_TRACING": "false",
               **self.env}
        log = (self.tmp / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "threadline", *args, "--config", str(PROJECT)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        self._procs.append(proc)
        return proc

    def start_api(self) -> str:
        port = _free_port()
        proc = self._spawn(["serve", "--port", str(port), "--workers", "0"], f"api-{port}")
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, self.logs()
            try:
                if httpx.get(f"{base}/ok", timeout=1).status_code == 200:
                    self.apis.append(base)
                    self.api_procs[base] = proc
                    return base
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError(f"API did not start: {self.logs()}")

    def start_worker(self) -> subprocess.Popen:
        """A worker process, once it says it has started: one that cannot start (PostgreSQL refusing
        connections: `too many clients`) fails here with its log, not later as a run that never starts."""
        name = f"worker-{len(self._procs)}"
        proc = self._spawn(["worker", "--workers", "10"], name)
        self.workers[proc.pid] = proc
        log = self.tmp / f"{name}.log"
        deadline = time.monotonic() + 60
        while "10 slots, agents" not in log.read_text(errors="replace"):
            assert proc.poll() is None, f"the worker process exited at its start: {self.logs()}"
            assert time.monotonic() < deadline, f"the worker process did not start in 60 s: {self.logs()}"
            time.sleep(0.1)
        return proc

    def holder(self, run_id: str) -> subprocess.Popen:
        """The worker process that holds `run_id` (from its worker id, `<host>-<pid>-<token>`)."""
        with psycopg.connect(self.backend.database_url) as conn:
            row = conn.execute("SELECT worker_id FROM runs WHERE run_id = %s", (run_id,)).fetchone()
        assert row and row[0], f"run {run_id} has no worker"
        return self.workers[int(row[0].rsplit("-", 2)[1])]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log")))

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def _backend(scaleout_services: ScaleOut, broker: str) -> Backend:
    """A fresh database; its broker Redis, or PostgreSQL alone (no Redis URL)."""
    backend = scaleout_services.fresh()
    if broker == "postgres":
        return dataclasses.replace(backend, redis_url=None, redis_key_prefix=None)
    if backend.redis_url is None:
        pytest.skip("THREADLINE_TEST_REDIS=memory: no Redis")
    return backend


@pytest.fixture(params=["redis", "postgres"])
def cluster(request: pytest.FixtureRequest, scaleout_services: ScaleOut, tmp_path: Path) -> Iterator[Cluster]:
    """Two workers and two API processes; their broker Redis, or PostgreSQL alone (no Redis URL)."""
    c = Cluster(_backend(scaleout_services, request.param), tmp_path)
    try:
        c.start_worker()
        c.start_worker()
        c.start_api()
        c.start_api()
        assert httpx.get(f"{c.apis[0]}/info").json()["broker"] == request.param
        yield c
    finally:
        c.close()


def _wait_status(base: str, tid: str, run_id: str, wanted: set[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = httpx.get(f"{base}/threads/{tid}/runs/{run_id}").json()
        if run["status"] in wanted:
            return run
        assert time.monotonic() < deadline, f"run stayed {run['status']}"
        time.sleep(0.05)


def _slow_run(base: str, steps: int, delay: float, tag: str = "t") -> tuple[str, str]:
    tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
    run = httpx.post(f"{base}/threads/{tid}/runs", json={
        "assistant_id": "slow", "input": {"tag": tag, "steps": steps, "delay": delay},
        "stream_mode": ["custom"]}).json()
    return tid, run["run_id"]


def _sse(response: httpx.Response) -> Iterator[tuple[str | None, str, str]]:
    """(id, event, data) of each SSE event."""
    ev_id, event, data = None, "", ""
    for line in response.iter_lines():
        if line.startswith("id:"):
            ev_id = line[3:].strip()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
        elif line == "" and event:
            yield ev_id, event, data
            ev_id, event, data = None, "", ""


def test_stream_created_on_a_resumed_on_b_with_last_event_id(cluster: Cluster) -> None:
    a, b = cluster.apis
    tid, run_id = _slow_run(a, steps=30, delay=0.1)
    url = f"{b}/threads/{tid}/runs/{run_id}/stream"
    seen: list[int] = []
    last_id = None
    with httpx.stream("GET", url, timeout=30) as r:
        assert r.status_code == 200
        for ev_id, event, data in _sse(r):
            if event == "custom":
                seen.append(httpx.Response(200, content=data).json()["step"])
                last_id = ev_id
                if len(seen) == 3:
                    break  # the client goes away mid-run
    assert last_id is not None
    with httpx.stream("GET", url, headers={"Last-Event-ID": last_id}, timeout=30) as r:
        rest = [httpx.Response(200, content=d).json()["step"] for _, e, d in _sse(r) if e == "custom"]
    # A join sees the events from when it joined on; the resumed stream exactly the ones it missed after
    # that: none twice, none lost.
    assert seen + rest == list(range(seen[0], 30))
    assert _wait_status(a, tid, run_id, {"success"})["status"] == "success"


def test_cancel_sent_to_b_stops_the_run_on_a_worker(cluster: Cluster) -> None:
    a, b = cluster.apis
    tid, run_id = _slow_run(a, steps=200, delay=0.05)
    _wait_status(a, tid, run_id, {"running"})
    r = httpx.post(f"{b}/threads/{tid}/runs/{run_id}/cancel", params={"wait": "true"}, timeout=30)
    assert r.status_code == 200
    assert httpx.get(f"{a}/threads/{tid}/runs/{run_id}").json()["status"] == "interrupted"
    # The agent really stopped: its node never returned, and the thread takes new runs at once.
    state = httpx.get(f"{a}/threads/{tid}/state").json()
    assert not (state["values"] or {}).get("done")
    again = httpx.post(f"{b}/threads/{tid}/runs/wait", json={
        "assistant_id": "slow", "input": {"tag": "next", "steps": 1, "delay": 0}}, timeout=30)
    assert again.status_code == 200 and again.json()["done"] == ["next"]


def test_cancel_without_wait_answers_once_storage_shows_the_run_stopped(cluster: Cluster) -> None:
    """The 202 of a cancel sent to one process comes once the worker that ran the run (another process)
    has recorded its end: a read right after, through any process, shows it stopped."""
    a, b = cluster.apis
    tid, run_id = _slow_run(a, steps=200, delay=0.05)
    _wait_status(a, tid, run_id, {"running"})
    r = httpx.post(f"{b}/threads/{tid}/runs/{run_id}/cancel", timeout=30)
    assert r.status_code == 202
    assert httpx.get(f"{a}/threads/{tid}/runs/{run_id}").json()["status"] == "interrupted"
    assert httpx.get(f"{a}/threads/{tid}").json()["status"] == "interrupted"


def test_kill_9_of_a_worker_mid_run_is_retried_elsewhere(cluster: Cluster) -> None:
    a, b = cluster.apis
    others = [_slow_run(b, steps=3, delay=0.3, tag=f"o{i}") for i in range(6)]
    tid, run_id = _slow_run(a, steps=40, delay=0.1, tag="victim")
    _wait_status(a, tid, run_id, {"running"})
    victim = cluster.holder(run_id)
    victim.kill()
    victim.wait(10)
    cluster.start_worker()  # keep two workers, as an orchestrator would
    # Retried on a live worker once its lease lapses (run_retries=1): it succeeds, exactly once in state.
    joined = httpx.get(f"{b}/threads/{tid}/runs/{run_id}/join", timeout=90)
    assert joined.status_code == 200, cluster.logs()
    assert joined.json()["done"] == ["victim"]
    assert httpx.get(f"{a}/threads/{tid}/runs/{run_id}").json()["status"] == "success"
    assert httpx.get(f"{a}/threads/{tid}").json()["status"] == "idle"
    # No other run was lost, and the thread is usable.
    for otid, orun in others:
        assert _wait_status(a, otid, orun, {"success", "error", "interrupted"})["status"] == "success"
    again = httpx.post(f"{a}/threads/{tid}/runs/wait", json={
        "assistant_id": "slow", "input": {"tag": "after", "steps": 1, "delay": 0}}, timeout=30)
    assert again.json()["done"] == ["victim", "after"]


def test_stalled_worker_past_its_lease_writes_nothing(cluster: Cluster) -> None:
    a, _ = cluster.apis
    tid, run_id = _slow_run(a, steps=30, delay=0.1, tag="stalled")
    _wait_status(a, tid, run_id, {"running"})
    stalled = cluster.holder(run_id)
    stalled.send_signal(signal.SIGSTOP)
    try:
        # The other worker takes the run over once the lease lapses, and finishes it.
        final = _wait_status(a, tid, run_id, {"success", "error"}, timeout=90)
        assert final["status"] == "success", cluster.logs()
    finally:
        stalled.send_signal(signal.SIGCONT)
    state_before = httpx.get(f"{a}/threads/{tid}/state").json()
    history_before = httpx.post(f"{a}/threads/{tid}/history", json={"limit": 100}).json()
    # The resumed worker notices it lost the lease and stops; give it time to try writing.
    deadline = time.monotonic() + 30
    log = cluster.tmp.glob("worker-*.log")
    while not any("lost the lease" in p.read_text() or "lease lost" in p.read_text() for p in log):
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.2)
        log = cluster.tmp.glob("worker-*.log")
    time.sleep(1.0)
    assert httpx.get(f"{a}/threads/{tid}/runs/{run_id}").json()["status"] == "success"
    assert httpx.get(f"{a}/threads/{tid}/state").json() == state_before
    assert httpx.post(f"{a}/threads/{tid}/history", json={"limit": 100}).json() == history_before
    assert state_before["values"]["done"] == ["stalled"]


@pytest.mark.timeout(300)  # 500 runs through two workers: ~20 s on a quiet 2-core machine, >120 s on a loaded one
def test_burst_of_500_runs_on_50_threads_each_runs_once_in_order(cluster: Cluster) -> None:
    apis = cluster.apis

    async def burst() -> dict[str, list[str]]:
        async with httpx.AsyncClient(timeout=60) as client:
            threads = [str(uuid.uuid4()) for _ in range(50)]

            async def one_thread(i: int, tid: str) -> list[str]:
                tags = [f"{i}-{n}" for n in range(10)]
                for n, tag in enumerate(tags):  # in order per thread; threads in parallel
                    r = await client.post(f"{apis[(i + n) % 2]}/threads/{tid}/runs", json={
                        "assistant_id": "slow", "input": {"tag": tag, "steps": 1, "delay": 0},
                        "if_not_exists": "create"})
                    assert r.status_code == 200, r.text
                return tags

            expected = await asyncio.gather(*(one_thread(i, t) for i, t in enumerate(threads)))
            return dict(zip(threads, expected, strict=True))

    expected = asyncio.run(burst())
    deadline = time.monotonic() + 180
    for tid, tags in expected.items():
        while True:
            runs = httpx.get(f"{apis[0]}/threads/{tid}/runs", params={"limit": 100}).json()
            if len(runs) == 10 and all(r["status"] in ("success", "error", "interrupted") for r in runs):
                break
            assert time.monotonic() < deadline, f"thread {tid}: {[r['status'] for r in runs]}"
            time.sleep(0.1)
        assert all(r["status"] == "success" for r in runs)
        # Each run's tag appears exactly once, in creation order: no run ran twice, none out of turn.
        assert httpx.get(f"{apis[1]}/threads/{tid}/state").json()["values"]["done"] == tags


@pytest.mark.parametrize("broker", ["redis", "postgres"])
def test_the_stream_cap_is_shared_by_api_processes_and_a_killed_one_frees_its_places(
        broker: str, scaleout_services: ScaleOut, tmp_path: Path) -> None:
    """`max_streams_per_identity` counts a client's streams on every API process together (through the broker),
    not per process; a process killed with a stream open holds its place until its lease (2 s here) runs out,
    and a stream that ends gives its place back at once."""
    c = Cluster(_backend(scaleout_services, broker), tmp_path,
                env={"THREADLINE_MAX_STREAMS_PER_IDENTITY": "1", "THREADLINE_STREAM_LEASE_SECONDS": "2"})
    try:
        a, b = c.start_api(), c.start_api()
        tid = httpx.post(f"{a}/threads", json={}).json()["thread_id"]
        # No worker: the run stays pending, and a join of it stays open for as long as the client wants.
        rid = httpx.post(f"{a}/threads/{tid}/runs", json={"assistant_id": "slow", "input": {"tag": "t"}}
                         ).json()["run_id"]
        join = f"/threads/{tid}/runs/{rid}/stream"
        with httpx.Client(timeout=30) as client, client.stream("GET", a + join) as held:
            assert held.status_code == 200
            refused = httpx.get(b + join, timeout=10)
            assert refused.status_code == 429, refused.text
            assert refused.json()["code"] == "too_many_streams"
            os.kill(c.api_procs[a].pid, signal.SIGKILL)  # its stream's place is never given back
            killed = time.monotonic()

        def accepted_on_b() -> bool:
            with httpx.stream("GET", b + join, timeout=10) as r:
                return r.status_code == 200  # (closed on leaving: the place is given back)

        deadline = killed + 30
        while not accepted_on_b():
            assert time.monotonic() < deadline, "the killed process's place was never freed"
            time.sleep(0.2)
        assert time.monotonic() - killed >= 1.0  # held for (about) its lease, not freed with the connection
        # A stream its client closed gives its place back: the next one is accepted. Not at once: the server
        # learns of the close when it next reads or writes (a CI run's next request came first, and got 429).
        # A place not given back would be renewed for as long as its process lives, so this wait would not end.
        deadline = time.monotonic() + 30
        while not accepted_on_b():
            assert time.monotonic() < deadline, "a closed stream's place was never given back"
            time.sleep(0.1)
    finally:
        c.close()
