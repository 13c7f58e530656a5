"""The benchmark graph: trivial and deterministic, no network, no API key.

Two nodes run in sequence:

* ``count``  - increments a counter (it appends no message, so the first
  ``messages`` stream event is the model's first token);
* ``reply``  - calls a fake chat model (``GenericFakeChatModel``) whose reply is
  streamed token by token, so ``stream_mode=messages-tuple`` yields a few
  ``messages`` events (used for time-to-first-token).

The same module is served by Threadline and by the reference ``langgraph dev``,
and imported in-process by ``bench/run.py`` for the floor measurement.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

REPLY_TEXT = "the quick brown fox jumps over the lazy dog"


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    count: Annotated[int, operator.add]


def count(state: State) -> dict[str, Any]:
    return {"count": 1}


async def reply(state: State) -> dict[str, Any]:
    # A fresh model per call: GenericFakeChatModel consumes its iterator.
    model = GenericFakeChatModel(messages=iter([AIMessage(content=REPLY_TEXT)]))
    msg = await model.ainvoke(state.get("messages") or [])
    return {"messages": [msg]}


def build() -> StateGraph:
    builder = StateGraph(State)
    builder.add_node("count", count)
    builder.add_node("reply", reply)
    builder.add_edge(START, "count")
    builder.add_edge("count", "reply")
    builder.add_edge("reply", END)
    return builder


# Served graph: the server supplies its own checkpointer.
graph = build().compile()
graph.name = "bench"


class Wait(TypedDict, total=False):
    seconds: float
    waited: Annotated[int, operator.add]


async def wait(state: Wait) -> dict[str, Any]:
    """An agent waiting on a model or a tool: no CPU, only time (the scale-out bench's I/O-bound cell)."""
    await asyncio.sleep(float(state.get("seconds") or 0.5))
    return {"waited": 1}


# Served as `wait`: one node that sleeps `seconds` (input), as I/O-bound agents spend their runs.
waiting = StateGraph(Wait)
waiting.add_node("wait", wait)
waiting.add_edge(START, "wait")
waiting.add_edge("wait", END)
wait_graph = waiting.compile()
wait_graph.name = "wait"
