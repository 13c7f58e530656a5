"""`core/remembered.py`: the checkpoint a state update wrote, read without reading it back, and the keys of
the values it changed against its parent, with LangGraph's in-memory saver under it (no backend: the module
never touches storage; the API tests in test_threads.py run it on both backends)."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from threadline.core.remembered import Remembering
from threadline.core.state import bind, snapshot_json, thread_config
from threadline.example.agents import counter
from threadline.storage.base import ValuesPatch

pytestmark = pytest.mark.asyncio


def patched(values: dict[str, Any], patch: ValuesPatch) -> dict[str, Any]:
    """What the row holds after the patch, onto the parent's values (PostgreSQL's `values || changed - removed`)."""
    return {k: v for k, v in {**values, **patch.changed}.items() if k not in patch.removed}


async def update(saver: InMemorySaver, thread: str, values: Any, as_node: str,
                 at: str | None = None) -> tuple[dict[str, Any], ValuesPatch | None, Remembering]:
    """A state update through `Remembering`, as `Threads.update_state` makes it: the state it shows after, read
    through the same wrapper, and the patch."""
    remembering = Remembering(saver)
    graph = bind(counter, remembering, None)
    await graph.aupdate_state(thread_config(thread, {"checkpoint_id": at} if at else None), values, as_node=as_node)
    snap = await graph.aget_state(thread_config(thread))
    state = snapshot_json(snap)
    return state, remembering.values_patch(state["checkpoint_id"], snap.values, graph.stream_channels_asis), \
        remembering


async def values_at(saver: InMemorySaver, thread: str, checkpoint_id: str) -> dict[str, Any]:
    graph = bind(counter, saver, None)
    state = snapshot_json(await graph.aget_state(thread_config(thread, {"checkpoint_id": checkpoint_id})))
    return dict(state["values"])


async def test_the_state_after_an_update_is_the_stored_one_and_the_patch_leads_to_it() -> None:
    saver = InMemorySaver()
    graph = bind(counter, saver, None)
    await graph.ainvoke({"increment": 2, "tag": "a"}, thread_config("t"))
    await graph.ainvoke({"increment": 3, "tag": "b"}, thread_config("t"))
    before = snapshot_json(await graph.aget_state(thread_config("t")))

    state, patch, remembering = await update(saver, "t", {"count": 10, "log": ["c"]}, "count")
    stored = snapshot_json(await graph.aget_state(thread_config("t")))
    assert state == {**stored, "metadata": state["metadata"]}  # the metadata as LangGraph gave it to the saver
    assert state["values"]["count"] == 15 and state["values"]["log"] == ["a", "b", "c"]
    assert patch is not None and patch.parent_checkpoint_id == before["checkpoint_id"]
    assert sorted(patch.changed) == ["count", "log"] and patch.removed == []  # `tag`, `increment` kept
    assert patched(before["values"], patch) == state["values"]
    assert remembering.latest is not None


async def test_a_copy_of_an_older_checkpoint_patches_nothing_onto_its_parent() -> None:
    """A copy (`as_node="__copy__"`) puts another checkpoint's values under that checkpoint's parent, and hands
    the saver no new versions: comparing those would say nothing changed against the parent."""
    saver = InMemorySaver()
    graph = bind(counter, saver, None)
    await graph.ainvoke({"increment": 2, "tag": "a"}, thread_config("t"))
    await graph.ainvoke({"increment": 3, "tag": "b"}, thread_config("t"))
    history = [s async for s in graph.aget_state_history(thread_config("t"))]
    older = history[1]  # the first run's last checkpoint: count 2
    assert older.values["count"] == 2 and older.parent_config is not None

    state, patch, _ = await update(saver, "t", None, "__copy__", at=older.config["configurable"]["checkpoint_id"])
    assert state["values"]["count"] == 2
    if patch is not None:  # only against a parent the update read, and then what leads to the copy's values
        parent = await values_at(saver, "t", patch.parent_checkpoint_id)
        assert patched(parent, patch) == state["values"]
