"""A graph whose state keeps a `DeltaChannel` (LangGraph's beta channel that checkpoints a sentinel and rebuilds its
value from the writes since its last snapshot) reads the same through the API, on both backends, as through
LangGraph's own `InMemorySaver`: the latest state, every checkpoint of the history, a state update, and a run
forked from an old checkpoint. The SQLite saver keeps large values apart and answers the delta history with
LangGraph's generic walk over `aget_tuple`; the state update's checkpointer answers the latest checkpoint from
memory (`core/remembered.py`); the run's is fenced. Each is in the way of the value's replay."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver

from tests.services import Backend
from threadline.settings import Settings

GRAPH = textwrap.dedent('''
    from typing import Annotated

    from langgraph.channels.delta import DeltaChannel
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict


    def add_items(state, writes):
        out = list(state or [])
        for batch in writes:
            out.extend(batch)
        return out


    class State(TypedDict, total=False):
        items: Annotated[list[str], DeltaChannel(add_items, snapshot_frequency=2)]
        turn: str


    def note(state: State) -> dict:
        return {"items": [f"note {len(state.get('items') or [])}"]}


    def echo(state: State) -> dict:
        return {"items": [f"echo {state.get('turn', '')}"]}


    graph = (StateGraph(State).add_node("note", note).add_node("echo", echo)
             .add_edge(START, "note").add_edge("note", "echo").compile())
''')
TURNS = ["a", "b", "c", "d", "e"]


@pytest.fixture
def settings(backend: Backend, tmp_path: Path) -> Settings:
    (tmp_path / "delta_graph.py").write_text(GRAPH)
    (tmp_path / "langgraph.json").write_text(json.dumps({"graphs": {"delta": "./delta_graph.py:graph"}}))
    return Settings(config=str(tmp_path / "langgraph.json"), workers=2, **backend.settings())


def reference(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    """The same graph on LangGraph's InMemorySaver, the turns run on one thread."""
    spec = importlib.util.spec_from_file_location("delta_graph_reference", tmp_path / "delta_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # for the state's annotations
    spec.loader.exec_module(module)
    graph = module.graph.copy(update={"checkpointer": InMemorySaver()})
    config = {"configurable": {"thread_id": "reference"}}
    return graph, config


async def test_a_delta_channel_reads_back_as_on_langgraphs_own_saver(http: httpx.AsyncClient,
                                                                    tmp_path: Path) -> None:
    graph, config = reference(tmp_path)
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    for turn in TURNS:
        await graph.ainvoke({"turn": turn}, config)
        answer = await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "delta", "input": {"turn": turn}})
        assert answer.status_code == 200, answer.text
        assert answer.json()["items"] == (await graph.aget_state(config)).values["items"]

    expected = [s.values async for s in graph.aget_state_history(config)]
    assert len(expected) > 2 * len(TURNS) and len(expected[0]["items"]) == 2 * len(TURNS)
    history = (await http.post(f"/threads/{tid}/history", json={"limit": 100})).json()
    assert [h["values"] for h in history] == expected
    assert (await http.get(f"/threads/{tid}")).json()["values"] == expected[0]

    # A state update appends through the reducer; the thread's cached values follow.
    await graph.aupdate_state(config, {"items": ["by hand"]}, as_node="echo")
    updated = await http.post(f"/threads/{tid}/state", json={"values": {"items": ["by hand"]}, "as_node": "echo"})
    assert updated.status_code == 200, updated.text
    want = (await graph.aget_state(config)).values
    assert want["items"][-1] == "by hand"
    assert (await http.get(f"/threads/{tid}/state")).json()["values"] == want
    assert (await http.get(f"/threads/{tid}")).json()["values"] == want

    # A run from an old checkpoint (the end of the second turn) replays that checkpoint's value, not the latest.
    old = next(h for h in history if h["values"].get("turn") == "b" and not h["next"])
    forked = await http.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": "delta", "input": {"turn": "f"}, "checkpoint_id": old["checkpoint_id"]})
    assert forked.status_code == 200, forked.text
    [reference_old] = [s.config async for s in graph.aget_state_history(config)
                       if s.values.get("turn") == "b" and not s.next]
    old_config = {"configurable": {"thread_id": "reference",
                                   "checkpoint_id": reference_old["configurable"]["checkpoint_id"]}}
    await graph.ainvoke({"turn": "f"}, old_config)
    assert forked.json()["items"] == (await graph.aget_state(config)).values["items"]
    assert forked.json()["items"] == [*old["values"]["items"], "note 4", "echo f"]
