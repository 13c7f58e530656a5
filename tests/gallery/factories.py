"""Graph factories, called by the server for each use: one taking the run config, one also the server runtime."""

from typing import TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph_sdk.runtime import ServerRuntime


class State(TypedDict):
    text: str


def _build(style: str) -> CompiledStateGraph:
    def shape(state: State) -> dict:
        return {"text": state["text"].upper() if style == "loud" else state["text"].lower()}

    builder = StateGraph(State)
    builder.add_node("shape", shape)
    builder.add_edge(START, "shape")
    builder.add_edge("shape", END)
    return builder.compile()


def make_with_config(config: RunnableConfig) -> CompiledStateGraph:
    return _build(config.get("configurable", {}).get("style", "quiet"))


def make_with_runtime(config: RunnableConfig, runtime: ServerRuntime) -> CompiledStateGraph:
    # The topology is the same for every access context; only the behaviour follows the config.
    return _build(config.get("configurable", {}).get("style", "quiet"))
