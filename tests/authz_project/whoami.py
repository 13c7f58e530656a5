"""A graph that answers with who it runs as: `config["configurable"]`'s `langgraph_auth_*` keys."""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph


class State(TypedDict, total=False):
    message: str
    seen: dict[str, Any]


def whoami(state: State, config: RunnableConfig) -> dict[str, Any]:
    configurable = config.get("configurable", {})
    user = configurable.get("langgraph_auth_user")
    return {"seen": {
        "user": dict(user) if user is not None else None,
        "identity_attr": getattr(user, "identity", None),  # LangGraph's server gives an object with attributes
        "user_id": configurable.get("langgraph_auth_user_id"),
        "permissions": configurable.get("langgraph_auth_permissions"),
    }}


graph = StateGraph(State).add_node(whoami).add_edge(START, "whoami").compile()
