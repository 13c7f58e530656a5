"""langgraph.json `encryption`: the project's `Encryption` handlers applied to everything Threadline stores
that LangGraph encrypts, on both backends. A marker put in every kind of record is found nowhere in the
database (SQLite: the files' bytes; PostgreSQL: every table's rows as text), while every read returns it."""

from __future__ import annotations

import base64
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient

from tests.conftest import serving_asgi
from tests.encryption_project import encryption as project_encryption
from tests.sdk_shapes import as_cron, one_state, wire
from tests.services import Backend
from tests.test_protocol import command, read_sse, root_done
from threadline.api.app import create_app
from threadline.config import load_config
from threadline.errors import ConfigError
from threadline.settings import Settings

MARKER = "zebra-marker-7f3c91"
TENANT = {"tenant": "acme"}
HEADERS = {"X-Encryption-Context": base64.b64encode(json.dumps(TENANT).encode()).decode()}
ENCRYPTION = "tests.encryption_project.encryption:encryption"


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, backend: Backend, **keys: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"echo": "threadline.example.agents:echo"}, **keys}))
    app = create_app(Settings(config=str(path), workers=2, **backend.settings()))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30, headers=HEADERS) as client:
            yield app, client


def stored_text(backend: Backend) -> str:
    """Everything the database holds, as text (bytes as they are, and as hex, as PostgreSQL shows bytea)."""
    if backend.kind == "sqlite":
        db = Path(backend.database_url.removeprefix("sqlite:///"))
        return "".join(f.read_bytes().decode("latin-1") for f in db.parent.glob(db.name + "*"))
    with psycopg.connect(backend.database_url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()").fetchall()]
        rows = [str(r[0]) for t in tables for r in conn.execute(f'SELECT t::text FROM "{t}" t').fetchall()]
    return "\n".join(rows)


def found_in(text: str) -> bool:
    return MARKER in text or MARKER.encode().hex() in text


async def test_a_marker_in_every_record_is_stored_encrypted_and_read_back(tmp_path: Path, backend: Backend) -> None:
    project_encryption.SEEN.clear()
    project_encryption.TENANTS.clear()
    secret = {"secret": MARKER}
    async with serve(tmp_path, backend, encryption={"path": ENCRYPTION}) as (app, http):
        sdk = LangGraphClient(http)
        assistant = await sdk.assistants.create("echo", config={"tags": [MARKER]}, context=secret,
                                                metadata=secret)
        thread = await sdk.threads.create(metadata=secret)
        tid = thread["thread_id"]
        message: dict[str, Any] = {"messages": [{"role": "user", "content": MARKER}]}
        # One run through a worker (its checkpoints take the context the run was stored with), one started here.
        queued = await sdk.runs.create(tid, assistant["assistant_id"], input=message, metadata=secret)
        await sdk.runs.join(tid, queued["run_id"])
        await sdk.runs.wait(tid, assistant["assistant_id"], input=message, metadata=secret)
        cron = as_cron(await sdk.crons.create_for_thread(tid, assistant["assistant_id"], schedule="0 0 1 1 *",
                                                         input=message, metadata=secret))
        await sdk.store.put_item(["notes"], "n1", {"secret": MARKER})
        await sdk.store.put_item(["notes"], "n2", {"secret": MARKER}, ttl=5)  # TTLs are the store's, as without

        assert not found_in(stored_text(backend))
        # Every read through the API gives the plaintext back.
        assert (await sdk.assistants.get(assistant["assistant_id"]))["config"]["tags"] == [MARKER]
        assert (await sdk.assistants.get(assistant["assistant_id"]))["metadata"]["secret"] == MARKER
        assert (await sdk.assistants.get(assistant["assistant_id"]))["context"] == secret
        got = await sdk.threads.get(tid)
        assert got["metadata"]["secret"] == MARKER
        assert one_state(got["values"])["messages"][0]["content"] == MARKER
        assert one_state((await sdk.threads.get_state(tid))["values"])["messages"][-1]["content"] == (
            f"You said: {MARKER}")
        history = await sdk.threads.get_history(tid)
        assert [h["metadata"]["step"] for h in history] == [6, 5, 4, 3, 2, 1, 0, -1]  # two runs' checkpoints
        assert all(MARKER in json.dumps(h["values"]) and h["metadata"]["secret"] == MARKER for h in history[:-1])
        run = await sdk.runs.get(tid, queued["run_id"])
        assert run["metadata"]["secret"] == MARKER
        assert wire(run)["kwargs"]["input"] == message
        assert [c["payload"]["input"] for c in await sdk.crons.search(thread_id=tid)] == [message]
        assert cron["metadata"]["secret"] == MARKER
        assert (await sdk.store.get_item(["notes"], "n1"))["value"] == {"secret": MARKER}
        assert [i["value"] for i in (await sdk.store.search_items(["notes"]))["items"]] == [secret, secret]
        assert [t["metadata"]["secret"] for t in await sdk.threads.search(metadata={"graph_id": "echo"})] == [MARKER]
        # A filter on an encrypted value matches nothing (as LangGraph documents); on a plain key it works.
        assert await sdk.threads.search(metadata=secret) == []
    seen = set(project_encryption.SEEN)
    assert {("encrypt", model, "metadata") for model in ("assistant", "thread", "run", "cron", "checkpoint")} <= seen
    assert {("encrypt", "checkpoint", "blob"), ("decrypt", "checkpoint", "blob"), ("encrypt", "store", "value"),
            ("encrypt", "run", "kwargs"), ("encrypt", "run", "input"), ("encrypt", "cron", "payload"),
            ("encrypt", "thread", "values")} <= seen
    # Every handler call had the request's context, the worker's and the reads' included (restored from the row).
    # Every handler call had the request's context, the worker's and the reads' included (restored from the
    # row); only the system assistants, created at startup outside any request, have none.
    assert {tenant for tenant, _ in project_encryption.TENANTS} == {"acme", None}
    assert {call[1] for tenant, call in project_encryption.TENANTS if tenant is None} == {"assistant"}


async def test_a_large_state_is_stored_sealed_and_read_back(tmp_path: Path, backend: Backend) -> None:
    """A state value of several KiB: SQLite keeps it apart from its checkpoints (`checkpoint_blobs`), PostgreSQL in
    its blob table; either way sealed, and every checkpoint that holds it reads it back."""
    long = (MARKER + " ") * 1_000  # 20 KB: past the 4 KiB at which SQLite stores a value apart
    async with serve(tmp_path, backend, encryption={"path": ENCRYPTION}) as (_, http):
        sdk = LangGraphClient(http)
        tid = (await sdk.threads.create())["thread_id"]
        for _ in range(2):  # the second run's checkpoints hold the first one's messages, unchanged at first
            message: dict[str, Any] = {"messages": [{"role": "user", "content": long}]}
            await sdk.runs.wait(tid, "echo", input=message)
        assert not found_in(stored_text(backend))
        if backend.kind == "sqlite":  # the sealed messages were stored apart, once per version
            db = sqlite3.connect(backend.database_url.removeprefix("sqlite:///"))
            try:
                assert db.execute("SELECT count(*) FROM checkpoint_blobs WHERE thread_id = ?", (tid,)).fetchone()[0]
            finally:
                db.close()
        history = await sdk.threads.get_history(tid)
        assert len(history) >= 6
        assert all(one_state(h["values"])["messages"][0]["content"] == long for h in history[:-1])
        state = one_state((await sdk.threads.get_state(tid))["values"])
        assert [m["content"] for m in state["messages"]] == [long, f"You said: {long}"] * 2


async def test_a_malformed_encryption_context_header_is_422(tmp_path: Path, backend: Backend) -> None:
    async with serve(tmp_path, backend, encryption={"path": ENCRYPTION}) as (_, http):
        refused = await http.post("/threads", json={}, headers={"X-Encryption-Context": "not base64!"})
        assert refused.status_code == 422
        assert "X-Encryption-Context" in refused.json()["detail"]
        listed = await http.post("/threads", json={}, headers={
            "X-Encryption-Context": base64.b64encode(b"[1, 2]").decode()})
        assert listed.status_code == 422


def test_encryption_must_name_an_encryption_instance(tmp_path: Path) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"echo": "threadline.example.agents:echo"},
                                "encryption": {"path": "tests.encryption_project.encryption:PREFIX"}}))
    assert load_config(path).encryption.path == "tests.encryption_project.encryption:PREFIX"
    with pytest.raises(ConfigError, match="Encryption instance"):
        create_app(Settings(config=str(path)))
    path.write_text(json.dumps({"graphs": {"echo": "threadline.example.agents:echo"}, "encryption": {"path": 3}}))
    with pytest.raises(ConfigError, match=r"encryption.path must be"):
        load_config(path)


async def test_a_cron_fires_its_runs_with_the_context_it_was_created_with(tmp_path: Path, backend: Backend) -> None:
    async with serve(tmp_path, backend, encryption={"path": ENCRYPTION}) as (app, http):
        sdk = LangGraphClient(http)
        tid = (await sdk.threads.create())["thread_id"]
        message: dict[str, Any] = {"messages": [{"role": "user", "content": MARKER}]}
        cron = as_cron(await sdk.crons.create_for_thread(tid, "echo", schedule="* * * * *", input=message))
        crons = app.state.runtime.crons
        later = datetime.now(UTC) + timedelta(minutes=2)
        crons.clock = lambda: later
        project_encryption.TENANTS.clear()
        assert await crons.run_due() == 1  # on the scheduler's task: no request, no header
        [fired] = await sdk.runs.list(tid)
        assert fired["metadata"]["cron_id"] == cron["cron_id"]
        await sdk.runs.join(tid, fired["run_id"])
        state = (await sdk.threads.get_state(tid))["values"]
        assert one_state(state)["messages"][-1]["content"] == f"You said: {MARKER}"
        assert not found_in(stored_text(backend))
    # Only the system assistant the cron names (made at startup, outside any request) was stored with no context.
    assert {(tenant, call) for tenant, call in project_encryption.TENANTS if tenant != "acme"} == {
        (None, ("decrypt", "assistant", "metadata"))}
    assert ("acme", ("encrypt", "checkpoint", "blob")) in project_encryption.TENANTS


async def test_the_codec_keeps_keys_and_shapes() -> None:
    from langgraph_sdk import Encryption
    from langgraph_sdk.encryption.types import DecryptResult

    from threadline.storage.encryption import CONTEXT_KEY, Codec, EncryptionFailed

    codec = Codec(project_encryption.encryption)
    for value in ([MARKER, 1], MARKER, {"a": {"b": MARKER}}, {"thread_id": "t", "x": MARKER}):
        sealed = await codec.seal("thread", "values", value)
        assert MARKER not in json.dumps(sealed) and CONTEXT_KEY in sealed
        assert await codec.open("thread", "values", sealed) == value
    assert (await codec.seal("thread", "metadata", {"thread_id": "t"})) == {"thread_id": "t"}  # ids stay plain
    assert await codec.open("thread", "metadata", {"plain": MARKER}) == {"plain": MARKER}  # written before

    merging = Encryption()

    @merging.encrypt.json
    async def consolidate(ctx: Any, data: dict[str, Any]) -> dict[str, Any]:
        return {"__encrypted__": json.dumps(data)}

    @merging.decrypt.json
    async def rotate(ctx: Any, data: dict[str, Any]) -> Any:
        return DecryptResult(plaintext={"k": "v"}, replacement=data)

    with pytest.raises(EncryptionFailed, match="must keep the keys"):
        await Codec(merging).seal("run", "metadata", {"k": "v"})
    assert await Codec(merging).open("run", "metadata", {"k": "x", CONTEXT_KEY: "{}"}) == {"k": "v"}


async def test_protocol_v2_events_are_stored_encrypted(tmp_path: Path, backend: Backend) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"echo": "threadline.example.agents:echo"},
                                "encryption": {"path": ENCRYPTION}}))
    async with serving_asgi(create_app(Settings(config=str(path), workers=2, **backend.settings()))) as url:
        async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=30) as client:
            tid = (await LangGraphClient(client).threads.create())["thread_id"]
        started = await command(url, tid, "run.start", {"assistant_id": "echo", "input": {
            "messages": [{"role": "user", "content": MARKER}]}})
        assert started["type"] == "success"
        frames = await read_sse(url, tid, {"channels": ["values", "lifecycle"]}, root_done)
        # Replayed from the stored log, decrypted: the run's values carry the marker.
        assert any(MARKER in json.dumps(f["data"]["params"]) for f in frames if f["event"] == "values")
        assert not found_in(stored_text(backend))


async def test_an_agents_calls_to_its_own_server_take_its_runs_context(tmp_path: Path, backend: Backend) -> None:
    """A node's `get_client()` (in-process) creates a thread and a run: stored with the calling run's context."""
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"echo": "threadline.example.agents:echo",
                                           "caller": "tests.project.userstyle:caller"},
                                "encryption": {"path": ENCRYPTION}}))
    app = create_app(Settings(config=str(path), workers=2, **backend.settings()))
    async with serving_asgi(app) as url, httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=30) as client:
        sdk = LangGraphClient(client)
        tid = (await sdk.threads.create())["thread_id"]
        project_encryption.TENANTS.clear()
        out = await sdk.runs.wait(tid, "caller", input={"text": MARKER})
        assert one_state(out)["answer"]["messages"][-1]["content"] == f"You said: {MARKER}"
        assert not found_in(stored_text(backend))
    assert {(tenant, call) for tenant, call in project_encryption.TENANTS if tenant != "acme"} <= {
        (None, ("decrypt", "assistant", "metadata"))}  # the system assistants, made at startup
    assert ("acme", ("encrypt", "thread", "values")) in project_encryption.TENANTS
