"""`Runtime[Context]`: a dataclass context with defaults, read by a node (LangGraph >= 0.6's run context)."""

from dataclasses import dataclass
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime


@dataclass
class Context:
    greeting: str = "Hello"
    punctuation: str = "!"


class State(TypedDict):
    name: str
    reply: str


def greet(state: State, runtime: Runtime[Context]) -> dict:
    return {"reply": f"{runtime.context.greeting}, {state['name']}{runtime.context.punctuation}"}


builder = StateGraph(State, context_schema=Context)
builder.add_node("greet", greet)
builder.add_edge(START, "greet")
builder.add_edge("greet", END)
graph = builder.compile()
