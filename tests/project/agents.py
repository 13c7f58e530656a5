"""Agents used only by the test suite."""

from __future__ import annotations

import asyncio
import operator
import time
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

#: Every unit of work the `slow` and `subagent` agents do, by tag: lets a test prove a cancelled agent stopped.
WORK_LOG: list[str] = []
#: The tags whose latest work the `slow` and `subagent` agents were cancelled in the middle of (the agent's task
#: got its CancelledError; work begun again on a tag takes it out): once a tag is here its agent does no more
#: work, so a test waits for it (`tests.waits.agent_stopped`) instead of sleeping to see the log stand still.
STOPPED: set[str] = set()


class SlowState(TypedDict, total=False):
    tag: str
    steps: int
    delay: float
    done: Annotated[list[str], operator.add]


async def _work(state: SlowState) -> dict[str, Any]:
    writer = get_stream_writer()
    tag = state.get("tag", "")
    STOPPED.discard(tag)
    try:
        for i in range(int(state.get("steps") or 3)):
            await asyncio.sleep(float(state.get("delay") or 0.05))
            WORK_LOG.append(f"{tag}:{i}")
            writer({"tag": tag, "step": i})
    except asyncio.CancelledError:
        STOPPED.add(tag)
        raise
    return {"done": [tag]}


def _one_node(state: type, name: str, node: Any) -> StateGraph:
    builder: StateGraph = StateGraph(state)
    builder.add_node(name, node)
    builder.add_edge(START, name)
    builder.add_edge(name, END)
    return builder


slow = _one_node(SlowState, "work", _work).compile()


def _work_sync(state: SlowState) -> dict[str, Any]:
    """The `slow` agent's work as a plain function: LangGraph runs it in a thread."""
    tag = state.get("tag", "")
    for i in range(int(state.get("steps") or 3)):
        time.sleep(float(state.get("delay") or 0.05))
        WORK_LOG.append(f"{tag}:{i}")
    return {"done": [tag]}


slow_sync = _one_node(SlowState, "work", _work_sync).compile()


class FailState(TypedDict, total=False):
    reason: str


def _fail(state: FailState) -> dict[str, Any]:
    raise ValueError(state.get("reason") or "boom")


failing = _one_node(FailState, "fail", _fail).compile()


class SubagentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    launched_by: dict[str, Any]


async def _research(state: SubagentState, config: RunnableConfig) -> dict[str, Any]:
    """Answer the latest request; `work <tag> <steps>` first does that many units of work, logged in WORK_LOG."""
    requests = [str(m.content) for m in state.get("messages") or [] if isinstance(m, HumanMessage)]
    words = requests[-1].split() if requests else []
    if words[:1] == ["work"]:
        STOPPED.discard(words[1])
        try:
            for i in range(int(words[2])):
                await asyncio.sleep(0.02)
                WORK_LOG.append(f"{words[1]}:{i}")
        except asyncio.CancelledError:
            STOPPED.add(words[1])
            raise
    # deepagents tells the subagent's run which agent launched it.
    launched_by = (config.get("configurable") or {}).get("deepagents_parent") or {}
    answer = AIMessage(content=f"Done: {requests[-1] if requests else ''} (request {len(requests)})")
    return {"messages": [answer], "launched_by": launched_by}


#: A deterministic async subagent for deepagents' AsyncSubAgentMiddleware (tests/test_deepagents.py).
subagent = _one_node(SubagentState, "research", _research).compile()


class NestState(TypedDict, total=False):
    items: Annotated[list[str], operator.add]


def _child_step(state: NestState) -> dict[str, Any]:
    return {"items": ["child"]}


child = _one_node(NestState, "child_step", _child_step).compile()


def _parent_step(state: NestState) -> dict[str, Any]:
    return {"items": ["parent"]}


_nested = StateGraph(NestState)
_nested.add_node("parent_step", _parent_step)
_nested.add_node("child", child)
_nested.add_edge(START, "parent_step")
_nested.add_edge("parent_step", "child")
_nested.add_edge("child", END)
nested = _nested.compile()


def make_factory_graph(config: dict[str, Any]) -> Any:
    """A graph factory taking the run config, as langgraph.json allows."""
    return _nested


class TalkState(TypedDict, total=False):
    words: int
    delay: float
    messages: Annotated[list[AnyMessage], add_messages]


async def _talk(state: TalkState) -> dict[str, Any]:
    """A chat model streaming a reply of `words` words, word by word (each word and each space a chunk), as a
    user's graph calls one; `delay` seconds between chunks. Two replies, so a stream holds two messages."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    words, delay = int(state.get("words") or 5), float(state.get("delay") or 0.0)
    replies = []
    for reply in range(2):
        text = " ".join(f"w{reply}.{i}" for i in range(words))
        model = GenericFakeChatModel(messages=iter([AIMessage(content=text)]))
        whole = None
        async for chunk in model.astream(state.get("messages") or [HumanMessage("talk")]):
            whole = chunk if whole is None else whole + chunk
            if delay:
                await asyncio.sleep(delay)
        replies.append(AIMessage(content=whole.content if whole is not None else "", id=whole.id if whole else None))
    return {"messages": replies}


#: A chat agent whose model streams long replies (`messages` and `messages-tuple` modes, memory tests).
talker = _one_node(TalkState, "talk", _talk).compile()
