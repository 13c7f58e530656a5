"""A run's checkpointer (`FencedCheckpointer`) remembers the run's last root checkpoint, so the state read when
the run ends comes from memory; it must be the state storage holds, in every case, and come from storage
whenever writes were put against that checkpoint."""

from __future__ import annotations

import contextlib
import operator
import sqlite3
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, cast

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointMetadata, empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict

from threadline.core.lease import FencedCheckpointer, Lease
from threadline.core.state import snapshot_json, thread_config
from threadline.storage import open_storage


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def _graph(second: Any, *, subgraph: bool = False) -> Any:
    builder = StateGraph(State)
    builder.add_node("first", lambda state: {"log": ["first"]})
    if subgraph:
        inner = StateGraph(State)
        inner.add_node("inner", second)
        inner.add_edge(START, "inner")
        inner.add_edge("inner", END)
        builder.add_node("second", inner.compile())
    else:
        builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder.compile()


def _ask(state: State) -> dict[str, Any]:
    return {"log": [str(interrupt("name?"))]}


CASES = {
    "plain": (lambda: _graph(lambda state: {"log": ["second"]}), {}, True),
    "subgraph": (lambda: _graph(lambda state: {"log": ["inner"]}, subgraph=True), {}, True),
    "interrupt_before": (lambda: _graph(lambda state: {"log": ["second"]}), {"interrupt_before": ["second"]}, True),
    # interrupt() puts the interrupt as a write against the last checkpoint: read back from storage.
    "interrupt()": (lambda: _graph(_ask), {}, False),
}


class _Counting:
    """Counts reads of the thread's latest root checkpoint that reach the saver."""

    def __init__(self, saver: Any) -> None:
        self.saver, self.latest_reads = saver, 0
        original = saver.aget_tuple

        async def aget_tuple(config: Any) -> Any:
            wanted = config["configurable"]
            if not wanted.get("checkpoint_id") and not wanted.get("checkpoint_ns"):
                self.latest_reads += 1
            return await original(config)

        saver.aget_tuple = aget_tuple


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("case", list(CASES))
async def test_the_state_after_a_run_is_the_stored_state(database_url: str, case: str, durability: str) -> None:
    build, options, from_memory = CASES[case]
    storage = await open_storage(database_url)
    try:
        saver = storage.run_checkpointer(durability)
        graph = build()
        thread = thread_config(str(uuid.uuid4()))
        counting = _Counting(saver)
        fenced = FencedCheckpointer(saver, Lease(str(uuid.uuid4()), 1, 30.0))
        run_graph = graph.copy(update={"checkpointer": fenced})
        async for _ in run_graph.astream({"log": ["input"]}, thread, durability=durability, **options):
            pass
        reads_before = counting.latest_reads
        remembered = snapshot_json(await run_graph.aget_state(thread))
        assert counting.latest_reads - reads_before == (0 if from_memory else 1)
        stored = snapshot_json(await graph.copy(update={"checkpointer": saver}).aget_state(thread))
        assert remembered == stored
        assert remembered["values"]["log"][:2] == ["input", "first"]
        if case in ("interrupt_before", "interrupt()"):
            assert remembered["next"] == ["second"]
        if case == "interrupt()":
            assert [i["value"] for t in remembered["tasks"] for i in t["interrupts"]] == ["name?"]
    finally:
        await storage.close()


async def test_a_write_put_before_its_checkpoint_is_saved_is_not_forgotten(database_url: str) -> None:
    """`async` durability saves checkpoints in the background: a task's writes against a checkpoint may be
    put before that checkpoint's own save returns. It must then not be remembered as having no writes."""
    from langgraph.checkpoint.base import empty_checkpoint

    storage = await open_storage(database_url)
    try:
        saver = storage.run_checkpointer("async")
        fenced = FencedCheckpointer(saver, Lease(str(uuid.uuid4()), 1, 30.0))
        thread = thread_config(str(uuid.uuid4()))
        checkpoint = empty_checkpoint()
        written = {"configurable": {**thread["configurable"], "checkpoint_id": checkpoint["id"]}}
        await fenced.aput_writes(written, [("log", "late")], str(uuid.uuid4()))
        await fenced.aput(thread, checkpoint, {"source": "loop", "step": 0}, {})
        found = await fenced.aget_tuple(thread)
        assert found is not None and [w[1:] for w in found.pending_writes] == [("log", "late")]
    finally:
        await storage.close()


@pytest.mark.parametrize("count", [1, 3, 600])
async def test_a_tasks_writes_come_back_in_order(database_url: str, count: int) -> None:
    """A task's writes, however many, are stored in one go and come back as the checkpoint's pending writes."""
    from langgraph.checkpoint.base import empty_checkpoint

    storage = await open_storage(database_url)
    try:
        saver = storage.run_checkpointer("async")
        thread = thread_config(str(uuid.uuid4()))
        saved = await saver.aput(thread, empty_checkpoint(), {"source": "loop", "step": 0}, {})
        task_id = str(uuid.uuid4())
        await saver.aput_writes(saved, [("log", f"w{i}") for i in range(count)], task_id)
        found = await saver.aget_tuple(thread)
        assert found is not None
        assert [w[1:] for w in found.pending_writes] == [("log", f"w{i}") for i in range(count)]
    finally:
        await storage.close()


async def test_a_history_lists_what_langgraphs_own_saver_lists(database_url: str) -> None:
    """Our savers read a thread's checkpoints their own way (SQLite: LangGraph's sync `list` on the writer's
    connection thread; PostgreSQL: loaded inline, jsonb with our one decoder): the tuples must be those
    LangGraph's own async saver reads from the same tables, pending writes (an interrupt's, two tasks') and
    subgraph namespaces included, whatever `limit`, `before` or `filter` selects."""
    storage = await open_storage(database_url)
    try:
        saver = storage.checkpointer
        graph = _graph(_ask, subgraph=True).copy(update={"checkpointer": saver})
        thread = thread_config(str(uuid.uuid4()))
        await graph.ainvoke({"log": ["input"]}, thread)
        checkpoint = empty_checkpoint()
        # A key of its own besides LangGraph's (a filter matches it): still a CheckpointMetadata at run time.
        metadata = cast(CheckpointMetadata, {"source": "update", "step": 9, "n": 2**62})
        at = await saver.aput(thread, checkpoint, metadata, {})
        await saver.aput_writes(at, [("log", "a1"), ("log", "a2")], "task-a")
        await saver.aput_writes(at, [("log", "b1")], "task-b", "~path")
        everything = [t async for t in saver.alist(thread)]
        newest = everything[0].config
        async with _langgraphs_saver(database_url, saver.serde) as theirs:
            cases: list[tuple[RunnableConfig, dict[str, Any]]] = [
                (thread, {}), ({"configurable": {"thread_id": thread["configurable"]["thread_id"]}}, {}),
                (thread, {"limit": 2}), (thread, {"before": newest}), (thread, {"filter": {"source": "loop"}}),
                (thread, {"filter": {"n": 2**62}, "limit": 1}),
            ]
            for config, kwargs in cases:
                ours = [t async for t in saver.alist(config, **kwargs)]
                assert ours == [t async for t in theirs.alist(config, **kwargs)], kwargs
                assert ours, kwargs
        assert len({t.config["configurable"]["checkpoint_ns"] for t in everything}) == 1  # root only, as asked
        whole: RunnableConfig = {"configurable": {"thread_id": thread["configurable"]["thread_id"]}}
        namespaced = [t async for t in saver.alist(whole)]
        assert len({t.config["configurable"]["checkpoint_ns"] for t in namespaced}) == 2  # and the subgraph's
        assert [w[:2] for w in everything[0].pending_writes] == [("task-a", "log"), ("task-a", "log"),
                                                                  ("task-b", "log")]
        assert any(w[1] == "__interrupt__" for t in everything for w in t.pending_writes)
    finally:
        await storage.close()


@contextlib.asynccontextmanager
async def _langgraphs_saver(database_url: str, serde: Any) -> AsyncIterator[Any]:
    """LangGraph's own saver on the same database (SQLite: its sync saver, whose `alist` is not callable on
    the loop, behind an async `alist`)."""
    if database_url.startswith("sqlite:"):
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(database_url.removeprefix("sqlite:").removeprefix("///"), check_same_thread=False)
        sync = SqliteSaver(conn, serde=serde)

        class Async:
            async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[Any]:
                for item in sync.list(config, **kwargs):
                    yield item

        try:
            yield Async()
        finally:
            conn.close()
        return
    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True, row_factory=dict_row) as pg:
        yield AsyncPostgresSaver(pg, serde=serde)
