"""The graphs of `bench/workloads.py`, written the way users write them; deterministic, no network, no API key.

* ``chat``   - ``MessagesState``, one node calling ``GenericFakeChatModel``, which streams its reply word by
  word (every word and every space is a chunk). The reply's length is the run's
  ``config.configurable.reply_tokens`` (default 4,000 chunks). With ``configurable.chat_model: "async"`` the
  model streams the same chunks from an ``_astream`` of its own (``NativeAsyncFakeModel``), as provider
  clients do, instead of a synchronous ``_stream`` that LangChain runs in a thread per chunk.
* ``agent``  - a tool-calling agent: a model node and a ``ToolNode``, looping through ``tools_condition``.
  The model asks for a tool on each of its first ``agent_steps - 1`` calls and answers on the last
  (``agent_steps`` default 25: 25 model calls, 24 tool calls, 49 steps, the message list grows to 50).
  Needs ``recursion_limit`` above 49 (LangGraph's default is 25), as any agent that long does.
* ``docs``   - a ``typing.TypedDict`` state that a node fills with ``n_docs`` documents of ``doc_chars``
  characters (200 x 5,000 = 1 MB of values), and a small ``notes`` key to update.
* ``ticker`` - a counter looping ``target`` times: one checkpoint per step (a 200-checkpoint thread).
* ``talk``   - ``MessagesState``, one node answering 5,000 characters at once (not streamed): a long
  conversation, whose cost per turn is its growing message list (400 messages: about 1 MB).

``bench/workloads.py`` imports this module for the in-process floor and for the expected replies.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from typing_extensions import TypedDict

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "agents", "stream",
         "their", "long", "answers"]


def reply_text(tokens: int) -> str:
    """A reply that GenericFakeChatModel streams as `tokens` chunks (words and the spaces between them)."""
    n_words = max(1, (tokens + 1) // 2)
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


def reply_chunks(tokens: int) -> int:
    return len(re.split(r"(\s)", reply_text(tokens)))


# --------------------------------------------------------------------------- chat: one long streamed reply


class NativeAsyncFakeModel(GenericFakeChatModel):
    """The same chunks, streamed by an `_astream` of its own, as provider clients stream (an async HTTP
    response): GenericFakeChatModel has only a synchronous `_stream`, which LangChain runs in a thread, one
    hop per chunk, a cost that the floor pays too and that hides the rest of a token's path. Each chunk is
    awaited as a network read is (`asyncio.sleep(0)`: the task yields to the loop, with no delay), so the
    server's readers wake for it, as they do for a provider's chunks."""

    async def _astream(self, messages: Any, stop: Any = None, run_manager: Any = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._stream(messages, stop=stop, run_manager=None, **kwargs):
            await asyncio.sleep(0)
            if run_manager:
                await run_manager.on_llm_new_token(str(chunk.message.content), chunk=chunk)
            yield chunk


async def respond(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
    configurable = config.get("configurable") or {}
    tokens = int(configurable.get("reply_tokens", 4000))
    kind = NativeAsyncFakeModel if configurable.get("chat_model") == "async" else GenericFakeChatModel
    model = kind(messages=iter([AIMessage(content=reply_text(tokens))]))
    return {"messages": [await model.ainvoke(state["messages"])]}


chat = StateGraph(MessagesState).add_node("respond", respond).add_edge(START, "respond").compile()
chat.name = "chat"


# --------------------------------------------------------------------------- agent: model + tools, 25 steps


class ToolCallingFakeModel(GenericFakeChatModel):
    """GenericFakeChatModel streams only text; a provider's model streams its tool calls too (last chunk)."""

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        result = self._generate(messages, stop=stop, run_manager=None, **kwargs)
        message = result.generations[0].message
        for token in re.split(r"(\s)", str(message.content)):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=token, id=message.id))
            if run_manager:
                run_manager.on_llm_new_token(token, chunk=chunk)
            yield chunk
        calls = getattr(message, "tool_calls", None) or []
        if calls:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content="", id=message.id, tool_call_chunks=[
                {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
                for i, c in enumerate(calls)]))
            if run_manager:
                run_manager.on_llm_new_token("", chunk=chunk)
            yield chunk


@tool
def search(query: str) -> str:
    """Look something up."""
    return f"Results for {query!r}: " + " ".join(WORDS * 4)


async def model(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
    steps = int((config.get("configurable") or {}).get("agent_steps", 25))
    done = sum(isinstance(m, AIMessage) for m in state["messages"])
    if done + 1 < steps:
        answer = AIMessage(content=f"Step {done + 1}: I need to look this up.",
                           tool_calls=[{"name": "search", "args": {"query": f"topic {done + 1}"},
                                        "id": f"call_{done + 1}"}])
    else:
        answer = AIMessage(content=f"Done after {done} searches.")
    llm = ToolCallingFakeModel(messages=iter([answer]))
    return {"messages": [await llm.ainvoke(state["messages"])]}


agent = (StateGraph(MessagesState).add_node("model", model).add_node("tools", ToolNode([search]))
         .add_edge(START, "model").add_conditional_edges("model", tools_condition).add_edge("tools", "model")
         .compile())
agent.name = "agent"


# --------------------------------------------------------------------------- docs: a 1 MB state


class DocsState(TypedDict, total=False):
    n_docs: int
    doc_chars: int
    documents: list[dict[str, Any]]
    notes: str


def load(state: DocsState) -> dict[str, Any]:
    if state.get("documents"):  # a later turn on the thread: the documents read, a small note written
        return {"notes": f"{len(state['documents'])} documents"}
    n, chars = state.get("n_docs", 200), state.get("doc_chars", 5000)
    text = (" ".join(WORDS) + " ") * (chars // 70 + 1)
    return {"documents": [{"id": i, "title": f"document {i}", "text": text[:chars]} for i in range(n)], "notes": ""}


docs = StateGraph(DocsState).add_node("load", load).add_edge(START, "load").compile()
docs.name = "docs"


# --------------------------------------------------------------------------- ticker: a checkpoint per step


class TickState(TypedDict):
    count: int
    target: int


def tick(state: TickState) -> dict[str, Any]:
    return {"count": state["count"] + 1}


def again(state: TickState) -> str:
    return "tick" if state["count"] < state["target"] else END


ticker = (StateGraph(TickState).add_node("tick", tick).add_edge(START, "tick")
          .add_conditional_edges("tick", again).compile())
ticker.name = "ticker"


# --------------------------------------------------------------------------- talk: a long conversation

REPLY_CHARS = 5000


def reply(state: MessagesState) -> dict[str, Any]:
    text = f"reply {len(state['messages'])}: " + (" ".join(WORDS) + " ") * (REPLY_CHARS // 70 + 1)
    return {"messages": [AIMessage(content=text[:REPLY_CHARS])]}


talk = StateGraph(MessagesState).add_node("reply", reply).add_edge(START, "reply").compile()
talk.name = "talk"
