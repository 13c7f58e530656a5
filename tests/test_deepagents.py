"""deepagents' async subagents, driven against a live Threadline server by the real package.

`AsyncSubAgentMiddleware` gives a deep agent's model five tools that reach a remote Agent Protocol server
through langgraph-sdk's `get_client(url=..., headers=...)`: `start_async_task` (create a thread, create a run),
`check_async_task` (get the run, read the thread's `values.messages`), `update_async_task` (a new run on the
same thread with `multitask_strategy="interrupt"`, or `"enqueue"`), `cancel_async_task` and
`list_async_tasks`. No model is needed: the tests call the tools as the agent's ToolNode would, with the
arguments a model sends and the parent's state, and keep that state from what the tools return.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, TypedDict, Unpack

import httpx
import pytest
from deepagents.middleware.async_subagents import AsyncSubAgent, AsyncSubAgentMiddleware
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langgraph.types import Command
from langgraph_sdk.client import LangGraphClient

from tests.sdk_shapes import user_says
from tests.waits import agent_stopped

PARENT_THREAD = "parent-thread-1"
SLOW = 500  # units of work (20 ms each) a `work` request asks for: far more than any test waits




@pytest.fixture
async def sdk_live(live_url: str) -> AsyncIterator[LangGraphClient]:
    """Our own view of the server, to check what the tools did there."""
    async with httpx.AsyncClient(base_url=live_url, timeout=30) as client:
        yield LangGraphClient(client)


class SubAgentOptions(TypedDict, total=False):
    """What a test sets of the researcher's `AsyncSubAgent` spec, over the defaults `ParentAgent` gives it."""
    headers: dict[str, str]
    update_strategy: Literal["interrupt", "enqueue"]


class ParentAgent:
    """The deep agent's side: its state, and the tool calls its model would make."""

    def __init__(self, url: str, **options: Unpack[SubAgentOptions]) -> None:
        spec: AsyncSubAgent = {
            "name": "researcher", "description": "Researches a topic in the background", "graph_id": "subagent",
            "url": url, "headers": {"x-tenant": "tests"}, **options,
        }
        self.middleware = AsyncSubAgentMiddleware(async_subagents=[spec])
        self.tools = {tool.name: tool for tool in self.middleware.tools}
        self.state: dict[str, Any] = {"messages": [], "async_tasks": {}}
        self.calls = 0

    async def call(self, name: str, **args: Any) -> str:
        """Run one tool call; apply its state update as the agent's graph would; return what the model reads."""
        self.calls += 1
        call: ToolCall = {"type": "tool_call", "name": name, "id": f"call_{self.calls}", "args": args}
        self.state["messages"].append(AIMessage(content="", tool_calls=[call]))
        runtime = ToolRuntime(state=self.state, context=None, tool_call_id=call["id"], store=None,
                              stream_writer=lambda _: None,
                              config={"configurable": {"thread_id": PARENT_THREAD},
                                      "metadata": {"assistant_id": "parent"}})
        out = await self.tools[name].ainvoke({**call, "args": {**args, "runtime": runtime}})
        if isinstance(out, Command):
            self.state["messages"] += out.update["messages"]
            self.state["async_tasks"] = {**self.state["async_tasks"], **out.update.get("async_tasks", {})}
            out = out.update["messages"][-1]
        else:
            self.state["messages"].append(out)
        assert isinstance(out, ToolMessage)
        return str(out.content)

    async def start(self, description: str) -> str:
        said = await self.call("start_async_task", description=description, subagent_type="researcher")
        assert said.startswith("Launched async subagent. task_id: "), said
        return said.removeprefix("Launched async subagent. task_id: ")

    async def check_until(self, task_id: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while True:
            checked = json.loads(await self.call("check_async_task", task_id=task_id))
            if done(checked) or time.monotonic() > deadline:
                return checked
            await asyncio.sleep(0.05)

    def task(self, task_id: str) -> dict[str, Any]:
        return self.state["async_tasks"][task_id]

    async def aclose(self) -> None:
        # The tools keep their langgraph-sdk clients in the middleware's private cache; close them with the test.
        for client in self.middleware._clients._async.values():
            await client.aclose()


async def _wait_for_work(tag: str) -> None:
    from tests.project.agents import WORK_LOG

    deadline = time.monotonic() + 30
    while not any(w.startswith(f"{tag}:") for w in WORK_LOG):
        assert time.monotonic() < deadline, f"no work logged for {tag}"
        await asyncio.sleep(0.01)


def _work(tag: str) -> int:
    from tests.project.agents import WORK_LOG

    return sum(w.startswith(f"{tag}:") for w in WORK_LOG)


async def _assert_stopped(tag: str) -> None:
    """The agent doing `tag`'s work does no more of it."""
    done = _work(tag)
    await agent_stopped(tag)
    assert _work(tag) == done < SLOW


def _finished(checked: dict[str, Any]) -> bool:
    return checked["status"] not in ("pending", "running")


async def test_launch_check_redirect_cancel_list(live_url: str, sdk_live: LangGraphClient) -> None:
    parent = ParentAgent(live_url)
    try:
        # Launch, then check until the subagent answered: the answer is the last of the thread's values.messages.
        research = await parent.start("summarize the Agent Protocol")
        checked = await parent.check_until(research, _finished)
        assert checked == {"status": "success", "thread_id": research,
                           "result": "Done: summarize the Agent Protocol (request 1)"}
        assert parent.task(research)["status"] == "success"
        thread = await sdk_live.threads.get(research)
        assert thread["values"]["messages"][-1]["content"] == checked["result"]
        assert thread["values"]["launched_by"] == {"thread_id": PARENT_THREAD}  # the run's config reached the graph
        # The task's thread is findable from the parent, as deepagents documents.
        found = await sdk_live.threads.search(metadata={"parent_thread_id": PARENT_THREAD,
                                                        "subagent_name": "researcher"})
        assert [t["thread_id"] for t in found] == [research]

        # A long task, redirected while it works: the follow-up interrupts it, on the same thread.
        long = await parent.start(f"work first {SLOW}")
        await _wait_for_work("first")
        first_run = parent.task(long)["run_id"]
        listed = await parent.call("list_async_tasks")
        assert listed.splitlines() == ["2 tracked task(s):",
                                       f"- task_id: {research}  agent: researcher  status: success",
                                       f"- task_id: {long}  agent: researcher  status: running"]
        said = await parent.call("update_async_task", task_id=long, message="work second 3")
        assert said == f"Updated async subagent. task_id: {long}"
        assert parent.task(long)["run_id"] != first_run
        checked = await parent.check_until(long, _finished)
        # The follow-up saw the original request too: same thread, full history.
        assert checked == {"status": "success", "thread_id": long, "result": "Done: work second 3 (request 2)"}
        assert (await sdk_live.runs.get(long, first_run))["status"] == "interrupted"
        assert _work("second") == 3
        await _assert_stopped("first")

        # Cancel a working task: the agent stops for real.
        doomed = await parent.start(f"work doomed {SLOW}")
        await _wait_for_work("doomed")
        said = await parent.call("cancel_async_task", task_id=doomed)
        assert said == f"Cancelled async subagent task: {doomed}"
        checked = await parent.check_until(doomed, lambda c: c["status"] == "cancelled")
        assert checked == {"status": "cancelled", "thread_id": doomed}
        assert (await sdk_live.runs.get(doomed, parent.task(doomed)["run_id"]))["status"] == "interrupted"
        await _assert_stopped("doomed")

        listed = await parent.call("list_async_tasks")
        assert listed.splitlines() == ["3 tracked task(s):",
                                       f"- task_id: {research}  agent: researcher  status: success",
                                       f"- task_id: {long}  agent: researcher  status: success",
                                       f"- task_id: {doomed}  agent: researcher  status: cancelled"]
        listed = await parent.call("list_async_tasks", status_filter="cancelled")
        assert listed.splitlines() == ["1 tracked task(s):",
                                       f"- task_id: {doomed}  agent: researcher  status: cancelled"]
    finally:
        await parent.aclose()


async def test_queued_follow_up_then_cancel_stops_both_runs(live_url: str, sdk_live: LangGraphClient) -> None:
    """With `update_strategy="enqueue"` the follow-up waits behind the working run; cancel stops both."""
    parent = ParentAgent(live_url, update_strategy="enqueue")
    try:
        task = await parent.start(f"work busy {SLOW}")
        await _wait_for_work("busy")
        busy_run = parent.task(task)["run_id"]
        said = await parent.call("update_async_task", task_id=task, message=f"work queued {SLOW}")
        assert said == f"Queued follow-up to async subagent without interrupting its current run. task_id: {task}"
        assert parent.task(task)["status"] == "pending" and parent.task(task)["superseded_run_ids"] == [busy_run]
        queued_run = parent.task(task)["run_id"]
        checked = json.loads(await parent.call("check_async_task", task_id=task))
        assert checked["status"] == "pending"  # the queued run has not started: the first one still works
        assert (await sdk_live.runs.get(task, busy_run))["status"] == "running"

        said = await parent.call("cancel_async_task", task_id=task)
        assert said == f"Cancelled async subagent task: {task}"
        checked = await parent.check_until(task, lambda c: c["status"] == "cancelled")
        assert checked == {"status": "cancelled", "thread_id": task}
        for run_id in (queued_run, busy_run):
            deadline = time.monotonic() + 30
            while (status := (await sdk_live.runs.get(task, run_id))["status"]) in ("pending", "running"):
                assert time.monotonic() < deadline, run_id
                await asyncio.sleep(0.05)
            assert status == "interrupted", run_id
        await _assert_stopped("busy")
        assert _work("queued") == 0  # the queued follow-up never started
    finally:
        await parent.aclose()


async def test_runs_on_a_task_thread_carry_its_parent(live_url: str, sdk_live: LangGraphClient) -> None:
    """deepagents finds the launching agent of a run it did not start (say, the user answering the subagent)
    in the run's metadata, which LangGraph's server merges from the task thread's."""
    parent = ParentAgent(live_url)
    try:
        task = await parent.start("summarize the Agent Protocol")
        await parent.check_until(task, _finished)
        more = user_says("more")
        run = await sdk_live.runs.create(task, "subagent", input=more)
        metadata = (await sdk_live.runs.get(task, run["run_id"]))["metadata"]
        assert metadata.get("parent_thread_id") == PARENT_THREAD and metadata.get("subagent_name") == "researcher"
    finally:
        await parent.aclose()
