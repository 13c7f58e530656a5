"""`core/remembered.py`: the checkpoint a state update wrote, read without reading it back, with LangGraph's
in-memory saver under it (no backend: the module never touches storage; the API tests in test_threads.py run
it on both backends)."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from threadline.core.remembered import Remembering
from threadline.core.state import bind, snapshot_json, thread_config
from threadline.example.agents import counter

pytestmark = pytest.mark.asyncio


async def update(saver: InMemorySaver, thread: str, values: Any, as_node: str,
                 at: str | None = None) -> tuple[dict[str, Any], Remembering]:
    """A state update through `Remembering`, as `Threads.update_state` makes it: the state it shows after, read
    through the same wrapper."""
    remembering = Remembering(saver)
    graph = bind(counter, remembering, None)
    await graph.aupdate_state(thread_config(thread, {"checkpoint_id": at} if at else None), values, as_node=as_node)
    snap = await graph.aget_state(thread_config(thread))
    return snapshot_json(snap), remembering


async def values_at(saver: InMemorySaver, thread: str, checkpoint_id: str) -> dict[str, Any]:
    graph = bind(counter, saver, None)
    state = snapshot_json(await graph.aget_state(thread_config(thread, {"checkpoint_id": checkpoint_id})))
    return dict(state["values"])


async def test_the_state_after_an_update_is_the_stored_one() -> None:
    saver = InMemorySaver()
    graph = bind(counter, saver, None)
    await graph.ainvoke({"increment": 2, "tag": "a"}, thread_config("t"))
    await graph.ainvoke({"increment": 3, "tag": "b"}, thread_config("t"))

    state, remembering = await update(saver, "t", {"count": 10, "log": ["c"]}, "count")
    stored = snapshot_json(await graph.aget_state(thread_config("t")))
    assert state == {**stored, "metadata": state["metadata"]}  # the metadata as LangGraph gave it to the saver
    assert state["values"]["count"] == 15 and state["values"]["log"] == ["a", "b", "c"]
    assert remembering.latest is not None


async def test_a_copy_of_an_older_checkpoint_shows_that_checkpoints_values() -> None:
    """A copy (`as_node="__copy__"`) puts another checkpoint's values under that checkpoint's parent: the state
    read through the wrapper is the copy's, as the saver stored it."""
    saver = InMemorySaver()
    graph = bind(counter, saver, None)
    await graph.ainvoke({"increment": 2, "tag": "a"}, thread_config("t"))
    await graph.ainvoke({"increment": 3, "tag": "b"}, thread_config("t"))
    history = [s async for s in graph.aget_state_history(thread_config("t"))]
    older = history[1]  # the first run's last checkpoint: count 2
    assert older.values["count"] == 2 and older.parent_config is not None

    state, _ = await update(saver, "t", None, "__copy__", at=older.config["configurable"]["checkpoint_id"])
    assert state["values"]["count"] == 2
    assert state["values"] == await values_at(saver, "t", state["checkpoint_id"])
