"""What each workload of ``bench/workloads.py`` does, against a server (HTTP, aiohttp, SSE read as it arrives) and
in process (the floor: the same graphs compiled with an ``InMemorySaver``, driven with ``astream`` / ``aget_state`` /
``aupdate_state`` / ``aget_state_history``).

Both sides take a ``Workload`` and give the same three things: ``setup`` (untimed: threads, a 1 MB state, a
200-checkpoint thread), ``warm`` (untimed: the same path once, small) and ``run`` (the measured part), which
returns a ``harness.CellResult`` plus the tokens streamed and the graph steps executed. Every stream and reply
is checked (the reassembled text equals the model's reply, the agent took all its steps, the state has all its
documents): a wrong answer counts as an error, not as a fast request.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import harness

PROJECT_DIR = Path(__file__).resolve().parent / "workloads_project"
INPUT = {"messages": [{"role": "user", "content": "hi"}]}
N_DOCS, DOC_CHARS = 200, 5000  # 1 MB of values
HISTORY_CHECKPOINTS = 200
TALK_TURNS = 200  # the conversation's earlier turns: 400 messages, about 1 MB
AGENT_RECURSION_LIMIT = 200


@dataclass(frozen=True)
class Workload:
    """One row of the table. `kind`: stream | agent | state-read | thread-read | state-update | state-run | history |
    talk."""

    name: str
    kind: str
    tokens: int = 0  # reply length (stream)
    concurrency: int = 1
    mode: str = ""  # stream mode (stream)
    reader: str = "full"  # full | slow | resume (stream)
    count: int = 1  # runs (agent) or requests (state rows); streams: one per client
    steps: int = 25  # model calls of the agent
    slow_ms: float = 10.0  # the slow reader's pause after each event
    model: str = "sync"  # the chat model (stream): sync (a thread per chunk) | async (its own `_astream`)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def load_graphs() -> Any:
    spec = importlib.util.spec_from_file_location("threadline_workload_graphs", PROJECT_DIR / "graphs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # StateGraph resolves the TypedDicts' annotations through sys.modules
    spec.loader.exec_module(module)
    return module


GRAPHS = load_graphs()


def warm_variant(wl: Workload) -> Workload:
    """The same path, small: compiles, imports and opens connections before anything is measured."""
    return Workload(wl.name + " (warm-up)", wl.kind, tokens=min(wl.tokens, 20), concurrency=1, mode=wl.mode,
                    reader="full" if wl.reader == "slow" else wl.reader, count=1, steps=3, slow_ms=0.0,
                    model=wl.model)


def steps_of(wl: Workload, completed: int) -> int:
    """Graph steps executed (a checkpoint each) by `completed` operations; state rows count requests."""
    if wl.kind == "stream":
        return completed  # one node: one step per run
    if wl.kind == "agent":
        return completed * (2 * wl.steps - 1)
    return completed


def check_docs_run(values: Any) -> None:
    """A run on the 1 MB thread answers the whole state: every document, and the note its node wrote."""
    if len(values["documents"]) != N_DOCS or values["notes"] != f"{N_DOCS} documents":
        raise RuntimeError(f"run on the 1 MB thread: {len(values['documents'])} documents, notes {values['notes']!r}")


def talk_history() -> list[dict[str, str]]:
    """The conversation so far, as a client sends it: a question and the graph's answer per turn."""
    out: list[dict[str, str]] = []
    for turn in range(TALK_TURNS):
        out.append({"role": "user", "content": f"question {turn}"})
        out.append({"role": "assistant", "content": f"reply {2 * turn + 1}: " + "x" * GRAPHS.REPLY_CHARS})
    return out


def check_talk_turn(values: Any, i: int) -> None:
    """A turn of the conversation answers the whole of it: the question asked last, and the node's reply."""
    messages = values["messages"]
    question, answer = messages[-2], messages[-1]
    if (len(messages) < 2 * TALK_TURNS + 3 or question.get("content") != f"turn {i}"
            or not str(answer.get("content")).startswith(f"reply {len(messages) - 1}: ")):
        raise RuntimeError(f"talk: {len(messages)} messages, the last two {question!r:.80} {answer!r:.80}")


def chat_config(wl: Workload) -> dict[str, Any]:
    return {"configurable": {"reply_tokens": wl.tokens, "chat_model": wl.model}}


def agent_config(wl: Workload) -> dict[str, Any]:
    return {"recursion_limit": AGENT_RECURSION_LIMIT, "configurable": {"agent_steps": wl.steps}}


class Tally:
    """What the operations of a run streamed, summed."""

    def __init__(self) -> None:
        self.tokens = 0


def check_text(got: str, want: str) -> None:
    if got != want:
        raise RuntimeError(f"reply differs: got {len(got)} chars {got[:60]!r}...{got[-40:]!r}, want {len(want)}")


# --------------------------------------------------------------------------- server side (HTTP)


async def sse(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str, str | None]]:
    """(event, data, id) of each server-sent event, as the bytes arrive."""
    buf = b""
    event, data, eid = "message", [], None
    async for chunk in resp.content.iter_any():
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl].rstrip(b"\r"), buf[nl + 1:]
            if not line:
                if data:
                    yield event, "\n".join(data), eid
                event, data, eid = "message", [], None
                continue
            field, _, value = line.decode().partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
            elif field == "id":
                eid = value


class StreamState:
    """The reply as a client of one stream mode sees it, rebuilt event by event."""

    def __init__(self, mode: str) -> None:
        self.mode, self.text, self.tokens, self.run_id, self.last_id, self.updates = mode, "", 0, None, None, 0

    def feed(self, event: str, data: str, eid: str | None) -> None:
        if eid:
            self.last_id = eid
        if event == "error":
            raise RuntimeError(f"error event: {data[:300]}")
        if event == "metadata":
            self.run_id = json.loads(data).get("run_id")
            return
        if event == "end" or not data:
            return
        payload = json.loads(data)
        if event == "messages":  # messages-tuple: [chunk, metadata]
            chunk = payload[0]
            if str(chunk.get("type", "")).lower().startswith("ai"):
                self.text += chunk.get("content") or ""
                self.tokens += 1
        elif event in ("messages/partial", "messages/complete"):  # messages: the whole message so far
            msg = payload[-1]
            if str(msg.get("type", "")).lower().startswith("ai"):
                self.text = msg.get("content") or ""
                self.tokens += event == "messages/partial"
        elif event == "values":
            msgs = payload.get("messages") or []
            if msgs and str(msgs[-1].get("type", "")).lower().startswith("ai"):
                self.text = msgs[-1].get("content") or ""
        elif event == "updates":
            self.updates += 1
            for update in payload.values():
                msgs = (update or {}).get("messages") or [] if isinstance(update, dict) else []
                if msgs and str(msgs[-1].get("type", "")).lower().startswith("ai"):
                    self.text = msgs[-1].get("content") or ""


class HttpOps:
    """The workloads against a server at `session`'s base URL."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.s = session
        self.threads: list[str] = []
        self.thread = ""

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        r = await harness.fetch(self.s, method, path, json_body=body)
        harness.raise_for(r, f"{method} {path}")
        return r.json()

    async def new_thread(self) -> str:
        return (await self.request("POST", "/threads", {}))["thread_id"]

    async def setup(self, wl: Workload) -> None:
        if wl.kind == "agent" or (wl.kind == "stream" and wl.reader == "resume"):
            self.threads = [await self.new_thread() for _ in range(wl.count if wl.kind == "agent" else wl.concurrency)]
        elif wl.kind in ("state-read", "thread-read", "state-update", "state-run"):
            self.thread = await self.new_thread()
            await self.request("POST", f"/threads/{self.thread}/runs/wait",
                               {"assistant_id": "docs", "input": {"n_docs": N_DOCS, "doc_chars": DOC_CHARS}})
        elif wl.kind == "talk":
            self.thread = await self.new_thread()
            await self.request("POST", f"/threads/{self.thread}/runs/wait",
                               {"assistant_id": "talk", "input": {"messages": talk_history()}})
        elif wl.kind == "history":
            self.thread = await self.new_thread()
            await self.request("POST", f"/threads/{self.thread}/runs/wait",
                               {"assistant_id": "ticker", "input": {"count": 0, "target": HISTORY_CHECKPOINTS},
                                "config": {"recursion_limit": HISTORY_CHECKPOINTS + 50}})

    async def stream(self, wl: Workload, i: int, tally: Tally) -> None:
        want = GRAPHS.reply_text(wl.tokens)
        body: dict[str, Any] = {"assistant_id": "chat", "input": INPUT, "config": chat_config(wl),
                                "stream_mode": [wl.mode]}
        path = "/runs/stream"
        if wl.reader == "resume":
            body["stream_resumable"] = True
            path = f"/threads/{self.threads[i]}/runs/stream"
        st = StreamState(wl.mode)
        half = GRAPHS.reply_chunks(wl.tokens) // 2
        async with self.s.post(path, json=body) as resp:
            if resp.status >= 300:
                harness.raise_for(harness.Reply(resp.status, await resp.read()), f"POST {path}")
            async for event, data, eid in sse(resp):
                st.feed(event, data, eid)
                if wl.reader == "slow":
                    await asyncio.sleep(wl.slow_ms / 1000)
                if wl.reader == "resume" and st.tokens >= half:
                    break  # leaving the block closes the connection midway
        if wl.reader == "resume":
            if not st.run_id or not st.last_id:
                raise RuntimeError(f"no run id / event id to resume from (run_id={st.run_id}, last id={st.last_id})")
            join = f"/threads/{self.threads[i]}/runs/{st.run_id}/stream"
            async with self.s.get(join, headers={"Last-Event-ID": st.last_id}) as resp:
                if resp.status >= 300:
                    harness.raise_for(harness.Reply(resp.status, await resp.read()), f"GET {join}")
                async for event, data, eid in sse(resp):
                    st.feed(event, data, eid)
        check_text(st.text, want)
        tally.tokens += st.tokens

    async def agent(self, wl: Workload, i: int, tally: Tally) -> None:
        body = {"assistant_id": "agent", "input": INPUT, "config": agent_config(wl),
                "stream_mode": ["messages-tuple", "updates"]}
        path = f"/threads/{self.threads[i]}/runs/stream"
        st = StreamState("updates")
        async with self.s.post(path, json=body) as resp:
            if resp.status >= 300:
                harness.raise_for(harness.Reply(resp.status, await resp.read()), f"POST {path}")
            async for event, data, eid in sse(resp):
                if event == "messages":
                    tally.tokens += 1
                    continue
                st.feed(event, data, eid)
        if st.updates != 2 * wl.steps - 1 or not st.text.startswith("Done after"):
            raise RuntimeError(f"agent: {st.updates} updates (want {2 * wl.steps - 1}), last reply {st.text[:80]!r}")

    async def op(self, wl: Workload, i: int, tally: Tally) -> None:
        if wl.kind == "stream":
            await self.stream(wl, i, tally)
        elif wl.kind == "agent":
            await self.agent(wl, i, tally)
        elif wl.kind == "state-read":
            state = await self.request("GET", f"/threads/{self.thread}/state")
            if len(state["values"]["documents"]) != N_DOCS:
                raise RuntimeError("state has the wrong number of documents")
        elif wl.kind == "thread-read":  # the thread itself, whose object carries its values
            thread = await self.request("GET", f"/threads/{self.thread}")
            if len(thread["values"]["documents"]) != N_DOCS:
                raise RuntimeError("thread has the wrong number of documents")
        elif wl.kind == "state-update":
            await self.request("POST", f"/threads/{self.thread}/state",
                               {"values": {"notes": f"note {i}"}, "as_node": "load"})
        elif wl.kind == "state-run":
            out = await self.request("POST", f"/threads/{self.thread}/runs/wait",
                                     {"assistant_id": "docs", "input": {"notes": f"run {i}"}})
            check_docs_run(out)
        elif wl.kind == "talk":
            check_talk_turn(await self.request("POST", f"/threads/{self.thread}/runs/wait", {
                "assistant_id": "talk", "input": {"messages": [{"role": "user", "content": f"turn {i}"}]}}), i)
        elif wl.kind == "history":
            hist = await self.request("POST", f"/threads/{self.thread}/history", {"limit": HISTORY_CHECKPOINTS})
            if len(hist) != HISTORY_CHECKPOINTS:
                raise RuntimeError(f"history: {len(hist)} checkpoints, want {HISTORY_CHECKPOINTS}")


# --------------------------------------------------------------------------- floor (in process)


class FloorOps:
    """The same workloads on the graphs in this process (``InMemorySaver``), as `graph.astream` etc."""

    def __init__(self) -> None:
        from langgraph.checkpoint.memory import InMemorySaver

        saver = InMemorySaver()
        self.graphs = {name: getattr(GRAPHS, name).builder.compile(checkpointer=saver)
                       for name in ("chat", "agent", "docs", "ticker", "talk")}
        self.threads: list[str] = []
        self.thread = ""

    @staticmethod
    def cfg(thread_id: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        extra = extra or {}
        return {**extra, "configurable": {**extra.get("configurable", {}), "thread_id": thread_id}}

    async def setup(self, wl: Workload) -> None:
        self.threads = [str(uuid.uuid4()) for _ in range(max(wl.count, wl.concurrency))]
        self.thread = str(uuid.uuid4())
        if wl.kind in ("state-read", "thread-read", "state-update", "state-run"):
            await self.graphs["docs"].ainvoke({"n_docs": N_DOCS, "doc_chars": DOC_CHARS}, self.cfg(self.thread))
        elif wl.kind == "talk":
            await self.graphs["talk"].ainvoke({"messages": talk_history()}, self.cfg(self.thread))
        elif wl.kind == "history":
            await self.graphs["ticker"].ainvoke({"count": 0, "target": HISTORY_CHECKPOINTS},
                                                self.cfg(self.thread, {"recursion_limit": HISTORY_CHECKPOINTS + 50}))

    async def stream(self, wl: Workload, i: int, tally: Tally) -> None:
        # A stateless run on a server still checkpoints to a thread of its own: a fresh thread id per run.
        mode = "messages" if wl.mode.startswith("messages") else wl.mode
        text, tokens = "", 0
        config = self.cfg(str(uuid.uuid4()), chat_config(wl))
        async for item in self.graphs["chat"].astream(INPUT, config, stream_mode=mode):
            if mode == "messages":
                text += item[0].content
                tokens += 1
            elif mode == "values":
                text = item["messages"][-1].content
            else:
                text = item["respond"]["messages"][-1].content
            if wl.reader == "slow":
                await asyncio.sleep(wl.slow_ms / 1000)
        check_text(text, GRAPHS.reply_text(wl.tokens))
        tally.tokens += tokens

    async def agent(self, wl: Workload, i: int, tally: Tally) -> None:
        updates, last = 0, ""
        async for mode, item in self.graphs["agent"].astream(INPUT, self.cfg(self.threads[i], agent_config(wl)),
                                                             stream_mode=["messages", "updates"]):
            if mode == "messages":
                tally.tokens += 1
            else:
                updates += 1
                last = str(list(item.values())[0]["messages"][-1].content)
        if updates != 2 * wl.steps - 1 or not last.startswith("Done after"):
            raise RuntimeError(f"agent: {updates} updates, last reply {last[:80]!r}")

    async def op(self, wl: Workload, i: int, tally: Tally) -> None:
        if wl.kind == "stream":
            await self.stream(wl, i, tally)
        elif wl.kind == "agent":
            await self.agent(wl, i, tally)
        elif wl.kind in ("state-read", "thread-read"):  # in process, the thread's values are its state's
            state = await self.graphs["docs"].aget_state(self.cfg(self.thread))
            if len(state.values["documents"]) != N_DOCS:
                raise RuntimeError("state has the wrong number of documents")
        elif wl.kind == "state-update":
            await self.graphs["docs"].aupdate_state(self.cfg(self.thread), {"notes": f"note {i}"}, as_node="load")
        elif wl.kind == "state-run":
            check_docs_run(await self.graphs["docs"].ainvoke({"notes": f"run {i}"}, self.cfg(self.thread)))
        elif wl.kind == "talk":
            out = await self.graphs["talk"].ainvoke({"messages": [{"role": "user", "content": f"turn {i}"}]},
                                                    self.cfg(self.thread))
            check_talk_turn({"messages": [{"content": m.content} for m in out["messages"]]}, i)
        elif wl.kind == "history":
            hist = [s async for s in self.graphs["ticker"].aget_state_history(
                self.cfg(self.thread), limit=HISTORY_CHECKPOINTS)]
            if len(hist) != HISTORY_CHECKPOINTS:
                raise RuntimeError(f"history: {len(hist)} checkpoints")


async def run(ops: HttpOps | FloorOps, wl: Workload) -> tuple[harness.CellResult, int]:
    """The measured part: `count` operations (`concurrency` clients for streams) in a closed loop."""
    tally = Tally()
    n = wl.concurrency if wl.kind == "stream" else wl.count
    res = await harness.run_cell(lambda i: ops.op(wl, i, tally), n, wl.concurrency, time_limit_s=3600.0)
    return res, tally.tokens
