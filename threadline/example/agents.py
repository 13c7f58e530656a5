"""The bundled example agents: served when `threadline serve` finds no config.

Every agent here is deterministic and needs no API key, except `chat`, which
uses a real chat model when a provider key is in the environment and says how
to get one otherwise. `assistant` calls a tool and streams its answer slowly,
for the web console (`/ui`).
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
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


# `assistant`: a tool-calling agent, written as users write one (a model bound to tools, a ToolNode,
# `tools_condition`), on a scripted model that streams its reply a word at a time, slowly enough to watch
# (and to cancel) in the web console.

@tool
def word_count(text: str) -> str:
    """Count the words in a text."""
    return f"{len(text.split())} words"


class ScriptedChatModel(BaseChatModel):
    """A stand-in for a real chat model: asks `word_count` about the latest human message, then answers
    with the tool's result, streaming one word every `delay` seconds."""

    delay: float = 0.05

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:  # the script knows its one tool
        return self

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1] if messages else None
        if isinstance(last, HumanMessage):
            return AIMessage(content="", tool_calls=[
                {"name": "word_count", "args": {"text": str(last.content)}, "id": f"call_{uuid.uuid4().hex[:12]}"}])
        asked = next((str(m.content) for m in reversed(messages) if isinstance(m, HumanMessage)), "")
        counted = str(last.content) if isinstance(last, ToolMessage) else "no words"
        return AIMessage(content=f"Your message has {counted}. You said: {asked}")

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: Any = None, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        reply = self._reply(messages)
        if reply.tool_calls:
            call = reply.tool_calls[0]
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[
                {"name": call["name"], "args": json.dumps(call["args"]), "id": call["id"], "index": 0}]))
            return
        words = str(reply.content).split(" ")
        for i, word in enumerate(words):
            await asyncio.sleep(self.delay)
            yield ChatGenerationChunk(message=AIMessageChunk(content=word if i == 0 else " " + word))


_model = ScriptedChatModel().bind_tools([word_count])


class AssistantState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


async def _call_model(state: AssistantState) -> dict[str, Any]:
    return {"messages": [await _model.ainvoke(state["messages"])]}


_assistant = StateGraph(AssistantState)
_assistant.add_node("model", _call_model)
_assistant.add_node("tools", ToolNode([word_count]))
_assistant.add_edge(START, "model")
_assistant.add_conditional_edges("model", tools_condition)
_assistant.add_edge("tools", "model")
assistant = _assistant.compile()
assistant.name = "assistant"
