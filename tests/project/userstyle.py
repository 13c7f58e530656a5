"""Graphs written the way users write them for `langgraph dev`: `typing.TypedDict` state (on Python 3.11,
where pydantic refuses it), `Runtime[Context]` nodes run without a context, graph factories taking
`(config, runtime)`, and a node that talks to its own server through `langgraph_sdk.get_client()`."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime
from langgraph_sdk import get_client
from langgraph_sdk.runtime import ServerRuntime

#: What the factories were called with, by graph: (access_context or None, the config's configurable).
FACTORY_CALLS: list[tuple[str, str | None, dict[str, Any]]] = []


class State(TypedDict, total=False):
    text: str
    trail: list[str]


@dataclass
class Context:
    greeting: str = "hello"
    punctuation: str = "!"


def greet(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    return {"text": f"{runtime.context.greeting} {state.get('text', '')}{runtime.context.punctuation}"}


_greeter = StateGraph(State, context_schema=Context)
_greeter.add_node("greet", greet)
_greeter.add_edge(START, "greet")
_greeter.add_edge("greet", END)
#: A `Runtime[Context]` graph whose context has defaults for every field.
greeter = _greeter.compile()


def _step(name: str) -> Any:
    def step(state: State) -> dict[str, Any]:
        return {"trail": [*(state.get("trail") or []), name]}

    return step


def _named_graph(config: RunnableConfig) -> Any:
    """Two steps whose names come from the assistant's config (`configurable.prefix`)."""
    prefix = (config.get("configurable") or {}).get("prefix", "step")
    if not prefix:
        raise ValueError("prefix must not be empty")
    builder = StateGraph(State)
    builder.add_node(f"{prefix}_one", _step(f"{prefix}_one"))
    builder.add_node(f"{prefix}_two", _step(f"{prefix}_two"))
    builder.add_edge(START, f"{prefix}_one")
    builder.add_edge(f"{prefix}_one", f"{prefix}_two")
    builder.add_edge(f"{prefix}_two", END)
    return builder.compile()


def _record(graph: str, config: RunnableConfig | None, runtime: Any) -> None:
    FACTORY_CALLS.append((graph, getattr(runtime, "access_context", None),
                          dict((config or {}).get("configurable") or {})))


def config_runtime_factory(config: RunnableConfig, runtime: ServerRuntime) -> Any:
    """`(config, runtime)`: the factory shape LangGraph's server documents for `ServerRuntime`."""
    _record("config_runtime", config, runtime)
    return _named_graph(config)


async def runtime_factory(runtime: ServerRuntime[Context]) -> Any:
    """`(runtime)` alone, async."""
    _record("runtime_only", None, runtime)
    return _named_graph({})


def config_factory(config: RunnableConfig) -> Any:
    _record("config_only", config, None)
    return _named_graph(config)


def bare_factory() -> Any:
    _record("bare", None, None)
    return _named_graph({})


@contextlib.asynccontextmanager
async def managed_factory(config: RunnableConfig, runtime: ServerRuntime) -> Any:
    """An async context manager factory: set up before the graph is used, torn down after."""
    _record("managed", config, runtime)
    yield _named_graph(config)


class CallerState(TypedDict, total=False):
    text: str
    assistants: list[str]
    answer: Any


async def call_server(state: CallerState) -> dict[str, Any]:
    """Uses the server it runs in, as deepagents' async subagents do: `get_client()` without a URL."""
    client = get_client()
    found = await client.assistants.search(limit=100)
    thread = await client.threads.create()
    given: dict[str, Any] = {"messages": [{"role": "user", "content": state.get("text") or "hi"}]}
    answer = await client.runs.wait(thread["thread_id"], "echo", input=given)
    await asyncio.sleep(0)
    return {"assistants": sorted(a["graph_id"] for a in found), "answer": answer}


_caller = StateGraph(CallerState)
_caller.add_node("call_server", call_server)
_caller.add_edge(START, "call_server")
_caller.add_edge("call_server", END)
#: A graph whose node calls its own server in-process.
caller = _caller.compile()


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def reply(state: ChatState) -> dict[str, Any]:
    return {"messages": [AIMessage(content=f"Heard: {state['messages'][-1].content}")]}


_chat = StateGraph(ChatState)
_chat.add_node("reply", reply)
_chat.add_edge(START, "reply")
_chat.add_edge("reply", END)
#: A chat agent with a `typing.TypedDict` state: MCP lists it, A2A sends it text.
chat = _chat.compile()
