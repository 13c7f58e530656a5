"""Two runs on one thread under each multitask strategy: no lost or mixed updates.

The module's tests share one started app per backend (tests/shared_app.py): each works on a thread of its own,
with tags of its own in the work log."""

from __future__ import annotations

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import Run

from tests.sdk_shapes import one_state
from tests.shared_app import shared_app
from tests.waits import logged, until

pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http = shared_app()


async def _start_slow(sdk: LangGraphClient, tid: str, tag: str) -> Run:
    from tests.project.agents import WORK_LOG

    run = await sdk.runs.create(tid, "slow", input={"tag": tag, "steps": 40, "delay": 0.02})
    await until(logged(WORK_LOG, f"{tag}:"))
    return run


async def test_reject(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    first = await _start_slow(sdk, tid, "rej-a")
    with pytest.raises(httpx.HTTPStatusError) as err:
        await sdk.runs.create(tid, "slow", input={"tag": "rej-b", "steps": 1}, multitask_strategy="reject")
    assert err.value.response.status_code == 409
    await sdk.runs.join(tid, first["run_id"])
    assert one_state((await sdk.threads.get_state(tid))["values"])["done"] == ["rej-a"]
    assert len(await sdk.runs.list(tid)) == 1


async def test_enqueue(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    first = await _start_slow(sdk, tid, "enq-a")
    second = await sdk.runs.create(tid, "slow", input={"tag": "enq-b", "steps": 1}, multitask_strategy="enqueue")
    assert second["status"] == "pending"
    await sdk.runs.join(tid, second["run_id"])
    assert (await sdk.runs.get(tid, first["run_id"]))["status"] == "success"
    assert (await sdk.runs.get(tid, second["run_id"]))["status"] == "success"
    assert one_state((await sdk.threads.get_state(tid))["values"])["done"] == ["enq-a", "enq-b"]


async def test_interrupt(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    first = await _start_slow(sdk, tid, "int-a")
    second = await sdk.runs.create(tid, "slow", input={"tag": "int-b", "steps": 1}, multitask_strategy="interrupt")
    await sdk.runs.join(tid, second["run_id"])
    assert (await sdk.runs.get(tid, first["run_id"]))["status"] == "interrupted"
    assert (await sdk.runs.get(tid, second["run_id"]))["status"] == "success"
    # The interrupted run never finished its node, so only the second run's update is in the state.
    assert one_state((await sdk.threads.get_state(tid))["values"])["done"] == ["int-b"]
    assert (await sdk.threads.get(tid))["status"] == "idle"


async def test_rollback(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "slow", input={"tag": "rb-0", "steps": 1})
    first = await _start_slow(sdk, tid, "rb-a")
    second = await sdk.runs.create(tid, "slow", input={"tag": "rb-b", "steps": 1}, multitask_strategy="rollback")
    await sdk.runs.join(tid, second["run_id"])
    with pytest.raises(httpx.HTTPStatusError) as err:
        await sdk.runs.get(tid, first["run_id"])
    assert err.value.response.status_code == 404
    assert one_state((await sdk.threads.get_state(tid))["values"])["done"] == ["rb-0", "rb-b"]
    # The rolled-back run left no checkpoint behind.
    history = await sdk.threads.get_history(tid, limit=100)
    assert all(h["metadata"].get("run_id") != first["run_id"] for h in history)


async def test_many_enqueued_runs_run_in_order(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    runs = [await sdk.runs.create(tid, "counter", input={"increment": 1, "tag": str(i)}) for i in range(8)]
    await sdk.runs.join(tid, runs[-1]["run_id"])
    state = await sdk.threads.get_state(tid)
    assert one_state(state["values"])["count"] == 8
    assert one_state(state["values"])["log"] == [str(i) for i in range(8)]
