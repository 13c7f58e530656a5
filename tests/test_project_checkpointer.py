"""langgraph.json `checkpointer.path`: the project's own saver keeps the graphs' checkpoints, on both backends;
state, history, time travel, copies and deletes go through it, and our checkpoint tables stay empty."""

from __future__ import annotations

import contextlib
import json
import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient

from tests.encryption_project import saver as project_saver
from tests.sdk_shapes import copy_thread, one_state, user_says
from tests.services import Backend
from threadline.api.app import create_app
from threadline.errors import ConfigError
from threadline.settings import Settings

SAVER = "tests.encryption_project.saver:checkpointer"


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, backend: Backend, **keys: Any) -> AsyncIterator[LangGraphClient]:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"echo": "threadline.example.agents:echo"}, **keys}))
    app = create_app(Settings(config=str(path), workers=2, **backend.settings()))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as client:
            yield LangGraphClient(client)


def our_checkpoints(backend: Backend, thread_id: str) -> int:
    """Checkpoint rows of the thread in the backend's own checkpoint table."""
    if backend.kind == "sqlite":
        import sqlite3

        with contextlib.closing(sqlite3.connect(backend.database_url.removeprefix("sqlite:///"))) as db:
            return int(db.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (thread_id,)).fetchone()[0])
    with psycopg.connect(backend.database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread_id,)).fetchone()
        return int(row[0]) if row else 0


def said(values: list[dict[str, Any]] | dict[str, Any]) -> list[str]:
    return [m["content"] for m in one_state(values)["messages"]]


async def test_the_project_saver_keeps_the_checkpoints(tmp_path: Path, backend: Backend) -> None:
    project_saver.CALLS.clear()
    project_saver.LIFECYCLE.clear()
    async with serve(tmp_path, backend, checkpointer={"path": SAVER}) as sdk:
        assert project_saver.LIFECYCLE == ["enter"]
        thread = await sdk.threads.create()
        tid = thread["thread_id"]
        await sdk.runs.wait(tid, "echo", input=user_says("one"))
        queued = await sdk.runs.create(tid, "echo", input=user_says("two"))
        await sdk.runs.join(tid, queued["run_id"])
        assert project_saver.CALLS["aput"] > 0 and project_saver.CALLS["aput_writes"] > 0
        assert our_checkpoints(backend, tid) == 0

        state = await sdk.threads.get_state(tid)
        assert said(state["values"]) == ["one", "You said: one", "two", "You said: two"]
        assert said((await sdk.threads.get(tid))["values"]) == said(state["values"])
        history = await sdk.threads.get_history(tid)
        assert [h["metadata"]["step"] for h in history] == [6, 5, 4, 3, 2, 1, 0, -1]
        # Time travel: a run from the checkpoint after the first answer forks the thread there.
        first_answer = next(h for h in history if said(h["values"]) == ["one", "You said: one"])
        await sdk.runs.wait(tid, "echo", input=user_says("three"),
                            checkpoint_id=first_answer["checkpoint"]["checkpoint_id"])
        assert said((await sdk.threads.get_state(tid))["values"]) == ["one", "You said: one", "three",
                                                                       "You said: three"]
        # A copy is made through the saver's own API (InMemorySaver has no acopy_thread).
        copy = await copy_thread(sdk, tid)
        assert said((await sdk.threads.get_state(copy["thread_id"]))["values"]) == said(
            (await sdk.threads.get_state(tid))["values"])
        assert len(await sdk.threads.get_history(copy["thread_id"])) == len(await sdk.threads.get_history(tid))
        await sdk.threads.delete(tid)
        assert project_saver.CALLS["adelete_thread"] == 1
    assert project_saver.LIFECYCLE == ["enter", "exit"]


def test_a_path_that_names_no_saver_stops_startup(tmp_path: Path, backend: Backend) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"echo": "threadline.example.agents:echo"},
                                "checkpointer": {"path": "tests.encryption_project.saver:CALLS"}}))

    async def start() -> None:
        app = create_app(Settings(config=str(path), **backend.settings()))
        async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30):
            pass

    import asyncio

    with pytest.raises(Exception) as caught:
        asyncio.run(start())
    cause: BaseException | None = caught.value
    while cause is not None and not isinstance(cause, ConfigError):
        cause = cause.__cause__ or cause.__context__
    assert cause is not None and "BaseCheckpointSaver" in str(cause)


async def test_with_encryption_the_project_saver_gets_only_ciphertext(tmp_path: Path, backend: Backend) -> None:
    marker = "okapi-marker-5d21"
    async with serve(tmp_path, backend, checkpointer={"path": SAVER},
                     encryption={"path": "tests.encryption_project.encryption:encryption"}) as sdk:
        tid = (await sdk.threads.create())["thread_id"]
        await sdk.runs.wait(tid, "echo", input=user_says(marker))
        assert said((await sdk.threads.get_state(tid))["values"]) == [marker, f"You said: {marker}"]
        saver = project_saver.SAVERS[-1]
        held = pickle.dumps((dict(saver.storage), dict(saver.writes), dict(saver.blobs)))
        assert saver.storage and marker.encode() not in held
