"""The bundled example agents: served when `threadline serve` finds no config.

Every agent here is deterministic and needs no API key, except `chat`, which
uses a real chat model when a provider key is in the environment and says how
to get one otherwise.
"""

from __future__ import annotations

import asyncio
import operator
import os
from typing import Annotated, Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt
from typing_extensions import TypedDict


class ChatState(TypedDict, total=False):
    """A conversation; free-form `message` / `prompt` inputs are accepted too."""

    messages: Annotated[list[AnyMessage], add_messages]
    message: str
    prompt: str


def _latest_text(state: ChatState) -> str:
    for key in ("message", "prompt"):
        if state.get(key):
            return str(state[key])
    for msg in reversed(state.get("messages") or []):
        if isinstance(msg, HumanMessage):
            return str(msg.content)
    return ""


def _incoming(state: ChatState) -> dict[str, Any]:
    """Turn a free-form `message`/`prompt` input into a human message."""
    text = state.get("message") or state.get("prompt")
    if not text:
        return {}
    return {"messages": [HumanMessage(content=str(text))], "message": "", "prompt": ""}


async def _echo_reply(state: ChatState) -> dict[str, Any]:
    text = _latest_text(state) or "(nothing)"
    model = GenericFakeChatModel(messages=iter([AIMessage(content=f"You said: {text}")]))
    reply = await model.ainvoke(state.get("messages") or [])
    return {"messages": [reply]}


def _chat_graph(reply_node: Any) -> Any:
    builder = StateGraph(ChatState)
    builder.add_node("incoming", _incoming)
    builder.add_node("reply", reply_node)
    builder.add_edge(START, "incoming")
    builder.add_edge("incoming", "reply")
    builder.add_edge("reply", END)
    return builder.compile()


echo = _chat_graph(_echo_reply)
echo.name = "echo"


async def _model_reply(state: ChatState) -> dict[str, Any]:
    if os.environ.get("OPENAI_API_KEY"):
        try:
            from langchain_openai import ChatOpenAI
        except ImportError:
            return {"messages": [AIMessage(content="pip install langchain-openai to use OPENAI_API_KEY")]}
        model = ChatOpenAI(model=os.environ.get("THREADLINE_EXAMPLE_MODEL", "gpt-4o-mini"))
        return {"messages": [await model.ainvoke(state.get("messages") or [])]}
    if os.environ.get("ANTHROPIC_API_KEY"):
        try:
            from langchain_anthropic import ChatAnthropic
        except ImportError:
            return {"messages": [AIMessage(content="pip install langchain-anthropic to use ANTHROPIC_API_KEY")]}
        # call-arg: mypy reads ChatAnthropic's aliased pydantic fields (model_name, timeout, stop) as required;
        # unused-ignore: without langchain-anthropic installed (deepagents, in the test extra, brings it) it is Any.
        model = ChatAnthropic(  # type: ignore[call-arg, unused-ignore]
            model=os.environ.get("THREADLINE_EXAMPLE_MODEL", "claude-3-5-haiku-latest"))
        return {"messages": [await model.ainvoke(state.get("messages") or [])]}
    note = "No model provider key is set (OPENAI_API_KEY or ANTHROPIC_API_KEY); echoing instead."
    return {"messages": [AIMessage(content=f"{note} You said: {_latest_text(state)}")]}


chat = _chat_graph(_model_reply)
chat.name = "chat"


class CounterState(TypedDict, total=False):
    """Each run adds `increment` to `count` and appends `tag` to `log`."""

    count: Annotated[int, operator.add]
    log: Annotated[list[str], operator.add]
    increment: int
    tag: str
    steps: int
    delay: float


async def _count(state: CounterState) -> dict[str, Any]:
    writer = get_stream_writer()
    steps = int(state.get("steps") or 1)
    for i in range(steps):
        writer({"step": i, "tag": state.get("tag", "")})
        if state.get("delay"):
            await asyncio.sleep(float(state["delay"]))
    return {"count": int(state.get("increment") or 1), "log": [str(state.get("tag", ""))]}


_counter = StateGraph(CounterState)
_counter.add_node("count", _count)
_counter.add_edge(START, "count")
_counter.add_edge("count", END)
counter = _counter.compile()
counter.name = "counter"


class ApprovalState(TypedDict, total=False):
    """A request that a human must approve before it is carried out."""

    request: str
    approved: bool
    outcome: str


def _ask(state: ApprovalState) -> dict[str, Any]:
    answer = interrupt({"question": f"Approve '{state.get('request', '')}'?"})
    return {"approved": bool(answer)}


def _act(state: ApprovalState) -> dict[str, Any]:
    verdict = "done" if state.get("approved") else "refused"
    return {"outcome": f"{verdict}: {state.get('request', '')}"}


_approval = StateGraph(ApprovalState)
_approval.add_node("ask", _ask)
_approval.add_node("act", _act)
_approval.add_edge(START, "ask")
_approval.add_edge("ask", "act")
_approval.add_edge("act", END)
approval = _approval.compile()
approval.name = "approval"
