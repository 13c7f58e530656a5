"""SQLite checkpoints keep their large channel values apart, once per version (`storage/sqlite_saver.py`).

LangGraph's `SqliteSaver` layout stores every checkpoint whole: a thread whose state holds 1 MB of documents
that no step changes grew by about 4 MB per run. These tests pin what the layout must keep: every checkpoint
reads back whole (history, forks, checkpoints written whole before), the large value is stored once per
version, and pruning, copying and deleting a thread keep, copy and drop those values with its checkpoints.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import StateGraph
from typing_extensions import TypedDict

from threadline.storage import open_storage
from threadline.storage.sqlite import SQLiteStorage
from threadline.storage.sqlite_saver import BLOB_BYTES


class State(TypedDict, total=False):
    docs: str
    count: int


def step(state: State) -> dict[str, Any]:
    return {"count": state.get("count", 0) + 1}


def graph(checkpointer: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.set_entry_point("step")
    return builder.compile(checkpointer=checkpointer)


def config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[SQLiteStorage]:
    opened = await open_storage(f"sqlite:///{tmp_path / 'blobs.db'}")
    assert isinstance(opened, SQLiteStorage)
    try:
        yield opened
    finally:
        await opened.close()


def rows(storage: SQLiteStorage, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(storage.url.removeprefix("sqlite:///"))
    try:
        return [tuple(row) for row in db.execute(sql, params)]
    finally:
        db.close()


DOCS = "the quick brown fox jumps over the lazy dog " * 2_000  # 88 KB: stored apart
OTHER = "a different set of documents " * 3_000


async def test_a_large_value_no_step_changes_is_stored_once_and_every_checkpoint_reads_it(
        storage: SQLiteStorage) -> None:
    tid = str(uuid.uuid4())
    g = graph(storage.checkpointer)
    await g.aupdate_state(config(tid), {"docs": DOCS, "count": 0}, as_node="step")
    for _ in range(3):
        await g.ainvoke({}, config(tid))
    history = [s async for s in g.aget_state_history(config(tid))]
    assert history[0].values["count"] == 3 and len(history) >= 7
    assert all(s.values["docs"] == DOCS for s in history)
    [(channel, size)] = rows(storage, "SELECT channel, length(blob) FROM checkpoint_blobs WHERE thread_id = ?", tid)
    assert channel == "docs" and len(DOCS) < size < len(DOCS) + 16  # the text, msgpack's header around it
    sizes = rows(storage, "SELECT length(checkpoint) FROM checkpoints WHERE thread_id = ?", tid)
    assert len(sizes) >= 4 and max(size for (size,) in sizes) < BLOB_BYTES

    # A fork from an older checkpoint: its own version of the value, the other branch keeps its own.
    older = history[-1]
    forked = await g.aupdate_state(older.config, {"docs": OTHER}, as_node="step")
    assert (await g.aget_state(forked)).values == {"docs": OTHER, "count": older.values["count"]}
    assert (await g.aget_state(history[0].config)).values == {"docs": DOCS, "count": 3}
    assert len(rows(storage, "SELECT 1 FROM checkpoint_blobs WHERE thread_id = ?", tid)) == 2


async def test_a_checkpoint_stored_whole_reads_as_it_is_and_the_next_stores_its_value_apart(
        storage: SQLiteStorage) -> None:
    """A database from before the layout: its checkpoints hold their values inside."""
    tid = str(uuid.uuid4())
    db = sqlite3.connect(storage.url.removeprefix("sqlite:///"), check_same_thread=False)
    try:
        graph(SqliteSaver(db)).update_state(config(tid), {"docs": DOCS, "count": 5}, as_node="step")
    finally:
        db.close()
    assert rows(storage, "SELECT count(*) FROM checkpoint_blobs WHERE thread_id = ?", tid) == [(0,)]
    g = graph(storage.checkpointer)
    assert (await g.aget_state(config(tid))).values == {"docs": DOCS, "count": 5}
    await g.ainvoke({}, config(tid))
    assert (await g.aget_state(config(tid))).values == {"docs": DOCS, "count": 6}
    assert rows(storage, "SELECT channel FROM checkpoint_blobs WHERE thread_id = ?", tid) == [("docs",)]


class CountingSerde(JsonPlusSerializer):
    """LangGraph's serializer, counting what it serialized that holds `text` (a value, or a checkpoint with it)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text.encode()
        self.large = 0

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = super().dumps_typed(obj)
        self.large += self.text in data
        return type_, data


async def test_a_large_value_is_serialized_once_by_a_step_that_changes_it_and_not_by_one_that_does_not(
        tmp_path: Path) -> None:
    """A long conversation's messages change at every turn: each checkpoint that changes them serializes them
    once (beside the write that changed them), and one that does not (the turn's input checkpoint) not at all, as
    LangGraph's own savers do. Before, every checkpoint of a large state was serialized whole first and its
    changed values again: 3 and 1 here."""
    serde = CountingSerde(OTHER)
    storage = await open_storage(f"sqlite:///{tmp_path / 'count.db'}", serde=serde)
    try:
        assert isinstance(storage, SQLiteStorage)
        tid = str(uuid.uuid4())
        g = graph(storage.checkpointer)
        await g.aupdate_state(config(tid), {"docs": DOCS, "count": 0}, as_node="step")  # large from the start
        for n in range(1, 4):
            serde.large = 0
            await g.aupdate_state(config(tid), {"docs": OTHER + str(n)}, as_node="step")  # changes it
            assert serde.large == 2  # the update's write, and the checkpoint's value
            serde.large = 0
            await g.aupdate_state(config(tid), {"count": n}, as_node="step")  # does not
            assert serde.large == 0
        state = await g.aget_state(config(tid))
        assert state.values == {"docs": OTHER + "3", "count": 3}
        history = [s.values async for s in g.aget_state_history(config(tid))]
        assert [h["docs"] for h in history[:3]] == [OTHER + "3", OTHER + "3", OTHER + "2"]
    finally:
        await storage.close()


async def test_a_state_that_shrinks_is_stored_whole_again(tmp_path: Path) -> None:
    """A thread whose large value is replaced by a small one: the checkpoint holds nothing apart, reads back, and
    the thread's next checkpoints are serialized once, whole, as a small thread's are (its value in the update's
    write and in the checkpoint: 2), not split value by value (3)."""
    serde = CountingSerde("short docs")
    storage = await open_storage(f"sqlite:///{tmp_path / 'shrink.db'}", serde=serde)
    try:
        assert isinstance(storage, SQLiteStorage)
        tid = str(uuid.uuid4())
        g = graph(storage.checkpointer)
        await g.aupdate_state(config(tid), {"docs": DOCS, "count": 0}, as_node="step")
        await g.aupdate_state(config(tid), {"docs": "short docs 1"}, as_node="step")
        for n in range(2, 4):
            serde.large = 0
            await g.aupdate_state(config(tid), {"docs": f"short docs {n}"}, as_node="step")
            assert serde.large == 2
        assert (await g.aget_state(config(tid))).values == {"docs": "short docs 3", "count": 0}
        assert rows(storage, "SELECT count(*) FROM checkpoint_blobs WHERE thread_id = ?", tid) == [(1,)]  # DOCS
    finally:
        await storage.close()


async def test_pruning_copying_and_deleting_a_thread_take_its_values_along(storage: SQLiteStorage) -> None:
    tid = str(uuid.uuid4())
    g = graph(storage.checkpointer)
    await g.aupdate_state(config(tid), {"docs": DOCS, "count": 0}, as_node="step")
    await g.aupdate_state(config(tid), {"docs": OTHER}, as_node="step")
    await g.ainvoke({}, config(tid))
    assert len(rows(storage, "SELECT 1 FROM checkpoint_blobs WHERE thread_id = ?", tid)) == 2

    copy = str(uuid.uuid4())
    await storage.copy_checkpoints(tid, copy)
    assert (await g.aget_state(config(copy))).values == {"docs": OTHER, "count": 1}

    await storage.prune_checkpoints(tid, "keep_latest")  # the latest holds OTHER's version only
    assert [s.values async for s in g.aget_state_history(config(tid))] == [{"docs": OTHER, "count": 1}]
    assert len(rows(storage, "SELECT 1 FROM checkpoint_blobs WHERE thread_id = ?", tid)) == 1
    assert len(rows(storage, "SELECT 1 FROM checkpoint_blobs WHERE thread_id = ?", copy)) == 2  # untouched

    await storage.checkpointer.adelete_thread(tid)
    assert rows(storage, "SELECT count(*) FROM checkpoint_blobs WHERE thread_id = ?", tid) == [(0,)]
    assert (await g.aget_state(config(copy))).values == {"docs": OTHER, "count": 1}
