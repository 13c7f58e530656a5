"""`core/history.py`: a history built with the lighter snapshot builder is LangGraph's own, snapshot for snapshot,
for graphs with interrupts, subgraphs, failed tasks, state updates, `Send`s, the functional API and pydantic
states (LangGraph's in-memory saver: no backend; the API's histories are in test_threads.py, on both)."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pydantic
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send

from tests.project.agents import failing, nested
from threadline.core.history import fast_history
from threadline.core.state import bind, snapshot_json, thread_config
from threadline.example.agents import approval, counter

pytestmark = pytest.mark.asyncio


class Fanned(TypedDict, total=False):
    topics: list[str]
    notes: Annotated[list[str], operator.add]


def _fan_out(state: Fanned) -> list[Send]:
    return [Send("note", {"topics": [t]}) for t in state.get("topics", [])]


_fanning = StateGraph(Fanned)
_fanning.add_node("note", lambda state: {"notes": [f"on {state['topics'][0]}"]})
_fanning.add_conditional_edges(START, _fan_out, ["note"])
_fanning.add_edge("note", END)
fanning = _fanning.compile()


class Typed(pydantic.BaseModel):
    count: int = 0


typed = StateGraph(Typed).add_node("bump", lambda s: {"count": s.count + 1}).add_edge(START, "bump").compile()


@task
def _double(x: int) -> int:
    return 2 * x


@entrypoint()
async def functional(x: int) -> int:
    return await _double(x)


async def histories(graph: Any, saver: InMemorySaver, thread: str) -> tuple[list[Any], list[Any], int]:
    """The thread's history by LangGraph's own builder and by ours, and how many checkpoints ours built alone."""
    config = thread_config(thread)
    own = [snapshot_json(s) async for s in bind(graph, saver, None).aget_state_history(config)]
    fast = fast_history(bind(graph, saver, None))
    full, handed = fast._aprepare_state_snapshot, 0
    if full is not graph._aprepare_state_snapshot:
        original = type(graph)._aprepare_state_snapshot

        async def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal handed
            handed += 1
            return await original(self, *args, **kwargs)

        type(graph)._aprepare_state_snapshot = counting
        try:
            ours = [snapshot_json(s) async for s in fast.aget_state_history(config)]
        finally:
            type(graph)._aprepare_state_snapshot = original
    else:
        ours = [snapshot_json(s) async for s in fast.aget_state_history(config)]
        handed = len(ours)
    return own, ours, len(ours) - handed


async def test_runs_updates_interrupts_subgraphs_and_errors_give_langgraphs_history() -> None:
    saver = InMemorySaver()
    c = bind(counter, saver, None)
    await c.ainvoke({"increment": 2, "tag": "a"}, thread_config("counter"))
    await c.aupdate_state(thread_config("counter"), {"count": 5}, as_node="count")
    await c.aupdate_state(thread_config("counter"), {"tag": "b"})  # as no node: its writes have no task
    a = bind(approval, saver, None)
    await a.ainvoke({"request": "deploy"}, thread_config("approval"))  # stops at the interrupt
    await a.ainvoke(Command(resume=True), thread_config("approval"))
    await bind(nested, saver, None).ainvoke({"items": []}, thread_config("nested"))
    with pytest.raises(ValueError):
        await bind(failing, saver, None).ainvoke({"reason": "no"}, thread_config("failing"))
    built = 0
    for graph, thread in ((counter, "counter"), (approval, "approval"), (nested, "nested"), (failing, "failing")):
        own, ours, alone = await histories(graph, saver, thread)
        assert len(own) >= 2 and ours == own, thread
        built += alone
    assert built >= 10  # most checkpoints were built by ours, not handed back


async def test_sends_the_functional_api_and_pydantic_states_give_langgraphs_history() -> None:
    saver = InMemorySaver()
    await bind(fanning, saver, None).ainvoke({"topics": ["a", "b"]}, thread_config("fanning"))
    await bind(functional, saver, None).ainvoke(3, thread_config("functional"))
    await bind(typed, saver, None).ainvoke({"count": 1}, thread_config("typed"))
    for graph, thread in ((fanning, "fanning"), (functional, "functional"), (typed, "typed")):
        own, ours, _ = await histories(graph, saver, thread)
        assert len(own) >= 2 and ours == own, thread
