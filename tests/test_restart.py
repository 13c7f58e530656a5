"""Durability: a clean restart keeps everything; a SIGKILL mid-run is recovered on the next start."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient

from tests.conftest import PROJECT
from threadline.api.app import create_app
from threadline.core.assistants import system_assistant_id
from threadline.settings import Settings
from threadline.storage.records import AssistantRecord


async def test_restart_keeps_assistants_threads_history_and_store(settings: Settings) -> None:
    async def session() -> tuple[LifespanManager, httpx.AsyncClient]:
        app = create_app(settings)
        manager = LifespanManager(app, startup_timeout=30)
        await manager.__aenter__()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=30)
        return manager, client

    manager, client = await session()
    sdk = LangGraphClient(client)
    assistant = await sdk.assistants.create("counter", name="kept", metadata={"k": 1})
    thread = await sdk.threads.create(metadata={"kept": True})
    await sdk.runs.wait(thread["thread_id"], "counter", input={"increment": 3, "tag": "a"})
    history = await sdk.threads.get_history(thread["thread_id"], limit=100)
    await sdk.store.put_item(["prefs", "u1"], "theme", {"dark": True})
    await client.aclose()
    await manager.__aexit__(None, None, None)

    manager, client = await session()
    sdk = LangGraphClient(client)
    assert (await sdk.assistants.get(assistant["assistant_id"]))["name"] == "kept"
    got = await sdk.threads.get(thread["thread_id"])
    assert got["metadata"]["kept"] is True and got["values"]["count"] == 3 and got["status"] == "idle"
    assert await sdk.threads.get_history(thread["thread_id"], limit=100) == history
    assert (await sdk.store.get_item(["prefs", "u1"], "theme"))["value"] == {"dark": True}
    assert len(await sdk.runs.list(thread["thread_id"])) == 1
    await client.aclose()
    await manager.__aexit__(None, None, None)


async def test_the_system_assistants_are_made_once_and_kept_across_restarts(settings: Settings) -> None:
    """At its first start the app makes one assistant per graph (the reference server's id, version 1, its one
    version stamped as it was made); a restart leaves them as they are, one changed since included, and makes
    again only one deleted meanwhile."""
    async def system_assistants() -> dict[str, tuple[AssistantRecord, list[AssistantRecord]]]:
        app = create_app(settings)
        async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30):
            storage = app.state.runtime.storage
            found = await storage.search_assistants(graph_id=None, name=None, metadata={"created_by": "system"},
                                                    limit=100, offset=0, sort_by="created_at", sort_order="asc")
            return {a["graph_id"]: (a, await storage.list_assistant_versions(
                a["assistant_id"], metadata=None, limit=10, offset=0)) for a in found}

    graph_ids = list(json.loads(PROJECT.read_text())["graphs"])
    first = await system_assistants()
    assert list(first) == graph_ids  # made in the graphs' order
    for graph_id, (row, versions) in first.items():
        assert row == {"assistant_id": system_assistant_id(graph_id), "graph_id": graph_id, "name": graph_id,
                       "description": None, "config": {}, "context": {}, "metadata": {"created_by": "system"},
                       "version": 1, "created_at": row["created_at"], "updated_at": row["created_at"]}
        assert versions == [{k: row[k] for k in ("assistant_id", "graph_id", "name", "description", "config",
                                                 "context", "metadata", "version", "created_at")}]
    assert await system_assistants() == first

    app = create_app(settings)
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30):
        assistants = app.state.runtime.assistants
        await assistants.patch(system_assistant_id("counter"), name="renamed")
        assert await assistants.storage.delete_assistant(system_assistant_id("echo"))
    again = await system_assistants()
    assert {k: v for k, v in again.items() if k not in ("counter", "echo")} == {
        k: v for k, v in first.items() if k not in ("counter", "echo")}
    counter, counter_versions = again["counter"]
    assert (counter["name"], counter["version"]) == ("renamed", 2)
    assert counter["created_at"] == first["counter"][0]["created_at"]
    assert counter_versions[1:] == first["counter"][1]
    echo, echo_versions = again["echo"]
    assert echo["version"] == 1 and echo["created_at"] > first["echo"][0]["created_at"]
    assert [(v["version"], v["created_at"]) for v in echo_versions] == [(1, echo["created_at"])]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(db: Path, port: int, log: Path, **settings: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]),
           **{f"THREADLINE_{k.upper()}": v for k, v in settings.items()}}
    proc = subprocess.Popen(
        [sys.executable, "-m", "threadline", "serve", "--config", str(PROJECT), "--port", str(port),
         "--database-url", f"sqlite:///{db}"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ok", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"server did not start: {log.read_text()}")


def _wait_running(base: str, tid: str, run_id: str) -> None:
    deadline = time.monotonic() + 20
    while httpx.get(f"{base}/threads/{tid}/runs/{run_id}").json()["status"] != "running":
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.02)


@pytest.mark.e2e  # real server processes
@pytest.mark.parametrize("waited", [False, True], ids=["background", "waited"])
def test_sigkill_mid_run_is_recovered(tmp_path: Path, waited: bool) -> None:
    """Killed mid-run, a run is retried once at restart (run_retries=1) and its thread is usable. A waited
    run starts at once on the server's own slot and writes its checkpoints in groups (`async` durability):
    it is retried from what was committed."""
    db, log = tmp_path / "t.db", tmp_path / "server.log"
    port = _free_port()
    proc = _start(db, port, log)
    base = f"http://127.0.0.1:{port}"
    try:
        tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
        body = {"assistant_id": "slow", "input": {"tag": "k", "steps": 30, "delay": 0.05}}
        if waited:  # the client waits in the background; the kill ends its request
            threading.Thread(target=_ignore_errors, daemon=True, args=(
                lambda: httpx.post(f"{base}/threads/{tid}/runs/wait", timeout=30, json=body),)).start()
            deadline = time.monotonic() + 20
            while not (runs := httpx.get(f"{base}/threads/{tid}/runs").json()):
                assert time.monotonic() < deadline, "the run was never created"
                time.sleep(0.02)
            run_id = runs[0]["run_id"]
        else:
            run_id = httpx.post(f"{base}/threads/{tid}/runs", json=body).json()["run_id"]
        _wait_running(base, tid, run_id)
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

        proc = _start(db, port, log)
        _assert_retried_and_usable(base, tid, run_id, "k")
    finally:
        proc.kill()
        proc.wait(10)


def _assert_retried_and_usable(base: str, tid: str, run_id: str, tag: str) -> None:
    """After the restart: the run is retried to success, its thread is idle and takes a new run."""
    joined = httpx.get(f"{base}/threads/{tid}/runs/{run_id}/join", timeout=60)
    assert joined.status_code == 200 and joined.json()["done"] == [tag]
    final = httpx.get(f"{base}/threads/{tid}/runs/{run_id}").json()
    assert final["status"] == "success"
    assert httpx.get(f"{base}/threads/{tid}").json()["status"] == "idle"
    again = httpx.post(f"{base}/threads/{tid}/runs/wait", json={
        "assistant_id": "slow", "input": {"tag": "after", "steps": 1}}, timeout=30)
    assert again.status_code == 200 and again.json()["done"] == [tag, "after"]


def _ignore_errors(call: object) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the server was killed under it
        call()  # type: ignore[operator]


@pytest.mark.e2e  # real server processes
def test_sigkill_without_retries_ends_run_as_error(tmp_path: Path) -> None:
    db, log = tmp_path / "t.db", tmp_path / "server.log"
    port = _free_port()
    proc = _start(db, port, log, run_retries="0")
    base = f"http://127.0.0.1:{port}"
    try:
        tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
        run = httpx.post(f"{base}/threads/{tid}/runs", json={
            "assistant_id": "slow", "input": {"tag": "x", "steps": 100, "delay": 0.05}}).json()
        _wait_running(base, tid, run["run_id"])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc = _start(db, port, log, run_retries="0")
        final = httpx.get(f"{base}/threads/{tid}/runs/{run['run_id']}").json()
        assert final["status"] == "error"
        thread = httpx.get(f"{base}/threads/{tid}").json()
        assert thread["status"] == "error" and thread["error"]["error"] == "WorkerLost"
        again = httpx.post(f"{base}/threads/{tid}/runs/wait", json={
            "assistant_id": "counter", "input": {"increment": 1}}, timeout=30)
        assert again.status_code == 200
    finally:
        proc.kill()
        proc.wait(10)


async def test_second_process_on_the_same_database(settings: Settings) -> None:
    """The embedded backend refuses a second process on its file; a shared database accepts it."""
    from threadline.errors import ConfigError
    from threadline.storage import open_storage

    first = await open_storage(settings.database_url)
    try:
        if first.capabilities["multi_process"]:
            second = await open_storage(settings.database_url)
            await second.close()
        else:
            with pytest.raises(ConfigError, match="another Threadline process"):
                await open_storage(settings.database_url)
    finally:
        await first.close()
    again = await open_storage(settings.database_url)  # released on close
    await again.close()


@pytest.mark.e2e  # real server processes
def test_second_server_on_the_same_file_exits_with_the_reason(tmp_path: Path) -> None:
    db, log = tmp_path / "t.db", tmp_path / "server.log"
    proc = _start(db, _free_port(), log)
    try:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
        second = subprocess.run(
            [sys.executable, "-m", "threadline", "serve", "--config", str(PROJECT), "--port", str(_free_port()),
             "--database-url", f"sqlite:///{db}"], capture_output=True, text=True, timeout=60, env=env)
        assert second.returncode != 0
        assert "another Threadline process is using" in second.stdout + second.stderr
        assert proc.poll() is None  # the first one keeps serving
    finally:
        proc.kill()
        proc.wait(10)


async def test_memory_database_is_refused() -> None:
    from threadline.errors import ConfigError
    from threadline.storage import open_storage

    with pytest.raises(ConfigError, match="file path"):
        await open_storage("sqlite:///:memory:")


def _lifecycle(base: str, tid: str) -> list[tuple[str, str]]:
    """(run id, event) of every root lifecycle event in the thread's protocol log so far."""
    out: list[tuple[str, str]] = []
    with httpx.stream("POST", f"{base}/threads/{tid}/stream/events", json={"channels": ["lifecycle"]},
                      timeout=10) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                import json

                env = json.loads(line[5:])
                if env["params"]["namespace"] == []:
                    out.append((env["event_id"].split(":")[0], env["params"]["data"]["event"]))
            elif line == "" and out and out[-1][1] in ("completed", "failed"):
                break
    return out


def _protocol_run(base: str, tid: str, steps: int) -> str:
    r = httpx.post(f"{base}/threads/{tid}/commands", json={"id": 1, "method": "run.start", "params": {
        "assistant_id": "slow", "input": {"tag": "p", "steps": steps, "delay": 0.05}}}, timeout=10)
    return r.json()["result"]["run_id"]


@pytest.mark.e2e  # real server processes
def test_a_protocol_run_stopped_by_a_shutdown_ends_once_with_its_real_end(tmp_path: Path) -> None:
    """SIGTERM returns the run to the queue: its clients must not be told `interrupted` before it runs again."""
    db, log = tmp_path / "t.db", tmp_path / "server.log"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(db, port, log)
    try:
        tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
        run_id = _protocol_run(base, tid, 40)
        _wait_running(base, tid, run_id)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        proc = _start(db, port, log)
        ends = [event for rid, event in _lifecycle(base, tid) if rid == run_id and event != "running"]
        assert ends == ["completed"]
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.e2e  # real server processes
def test_a_protocol_run_whose_worker_died_without_retries_ends_failed(tmp_path: Path) -> None:
    db, log = tmp_path / "t.db", tmp_path / "server.log"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(db, port, log, run_retries="0")
    try:
        tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
        run_id = _protocol_run(base, tid, 200)
        _wait_running(base, tid, run_id)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc = _start(db, port, log, run_retries="0")
        assert [event for rid, event in _lifecycle(base, tid) if rid == run_id] == ["running", "failed"]
    finally:
        proc.kill()
        proc.wait(10)
