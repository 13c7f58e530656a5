"""A run's checkpointer (`FencedCheckpointer`) remembers the run's last root checkpoint, so the state read when
the run ends comes from memory; it must be the state storage holds, in every case, and come from storage
whenever writes were put against that checkpoint."""

from __future__ import annotations

import operator
import uuid
from typing import Annotated, Any

import pytest
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
