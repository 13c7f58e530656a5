"""A graph that reads request headers from its config, as LangGraph's docs show for `configurable_headers`."""

from __future__ import annotations

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict


class State(TypedDict, total=False):
    headers: dict[str, str]


def read_headers(state: State, config: RunnableConfig) -> State:
    configurable = config.get("configurable") or {}
    return {"headers": {k: v for k, v in configurable.items() if isinstance(v, str) and "-" in k}}


builder = StateGraph(State)
builder.add_node("read_headers", read_headers)
builder.add_edge(START, "read_headers")
builder.add_edge("read_headers", END)
graph = builder.compile()
