"""The call sequence deepagents' async subagents make through langgraph-sdk, against Threadline.

Create a thread, start a run, poll it, read `values.messages`, start a new run with
`multitask_strategy="interrupt"`, cancel it, list the runs; the cancelled agent must do no further work.
"""

from __future__ import annotations

import asyncio
import uuid

from langgraph_sdk.client import LangGraphClient


async def test_async_subagent_sequence(sdk: LangGraphClient) -> None:
    from tests.project.agents import WORK_LOG

    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    run = await sdk.runs.create(tid, "echo", input={"messages": [{"role": "user", "content": "research X"}]})
    for _ in range(500):
        status = (await sdk.runs.get(tid, run["run_id"]))["status"]
        if status not in ("pending", "running"):
            break
        await asyncio.sleep(0.01)
    assert status == "success"
    values = (await sdk.threads.get(tid))["values"]
    assert values["messages"][-1]["content"] == "You said: research X"

    # A follow-up that interrupts whatever the subagent is doing, then a cancel.
    tag = uuid.uuid4().hex
    long_run = await sdk.runs.create(tid, "slow", input={"tag": tag, "steps": 200, "delay": 0.02},
                                     multitask_strategy="interrupt")
    while not any(w.startswith(tag) for w in WORK_LOG):
        await asyncio.sleep(0.01)
    follow = await sdk.runs.create(tid, "slow", input={"tag": tag + "-2", "steps": 200, "delay": 0.02},
                                   multitask_strategy="interrupt")
    while not any(w.startswith(tag + "-2") for w in WORK_LOG):
        await asyncio.sleep(0.01)
    assert (await sdk.runs.get(tid, long_run["run_id"]))["status"] == "interrupted"
    first_done = len([w for w in WORK_LOG if w.startswith(tag + ":")])
    await sdk.runs.cancel(tid, follow["run_id"])
    for _ in range(200):
        if (await sdk.runs.get(tid, follow["run_id"]))["status"] == "interrupted":
            break
        await asyncio.sleep(0.01)
    second_done = len([w for w in WORK_LOG if w.startswith(tag + "-2:")])
    await asyncio.sleep(0.3)
    # Neither cancelled agent did any more work.
    assert len([w for w in WORK_LOG if w.startswith(tag + ":")]) == first_done < 200
    assert len([w for w in WORK_LOG if w.startswith(tag + "-2:")]) == second_done < 200
    runs = await sdk.runs.list(tid)
    assert [r["status"] for r in runs] == ["interrupted", "interrupted", "success"]
