from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import ThreadState

from tests.sdk_shapes import copy_thread, one_state, wire
from tests.shared_app import shared_app
from tests.waits import agent_stopped, logged, until

# The module's tests share one started app per backend (tests/conftest.py, `module_served`): each reads and
# counts only the threads it made. They run in the app's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http = shared_app()


async def test_create_get_patch_delete(sdk: LangGraphClient) -> None:
    tid = str(uuid.uuid4())
    t = await sdk.threads.create(thread_id=tid, metadata={"purpose": "x"})
    assert t["thread_id"] == tid and t["status"] == "idle" and t["metadata"] == {"purpose": "x"}
    assert t["values"] is None and t["interrupts"] == {}
    got = await sdk.threads.get(tid)
    assert got["thread_id"] == tid
    patched = await sdk.threads.update(tid, metadata={"more": 1})
    assert patched["metadata"] == {"purpose": "x", "more": 1}
    await sdk.threads.delete(tid)
    with pytest.raises(httpx.HTTPStatusError) as err:
        await sdk.threads.get(tid)
    assert err.value.response.status_code == 404


async def test_search_selects_fields_and_refuses_unknown_ones(http: httpx.AsyncClient) -> None:
    thread = (await http.post("/threads", json={"metadata": {"k": "v"}, "graph_id": "counter", "supersteps": [
        {"updates": [{"values": {"count": 5, "log": ["seed"]}, "as_node": "count"}]}]})).json()
    assert thread["values"] == {"count": 5, "log": ["seed"]}
    found = await http.post("/threads/search", json={"ids": [thread["thread_id"]], "select": ["thread_id", "metadata"]})
    assert found.json() == [{"thread_id": thread["thread_id"], "metadata": thread["metadata"]}]
    # The values are read only when the answer shows them (a thread list that leaves them out reads none).
    for fields in (["thread_id", "values"], None):
        found = await http.post("/threads/search", json={"ids": [thread["thread_id"]], "select": fields})
        assert [t["values"] for t in found.json()] == [thread["values"]]
    refused = await http.post("/threads/search", json={"select": ["thread_id", "password"]})
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "select.1", refused.text


async def test_if_exists(sdk: LangGraphClient) -> None:
    tid = str(uuid.uuid4())
    await sdk.threads.create(thread_id=tid, metadata={"n": 1})
    with pytest.raises(httpx.HTTPStatusError) as err:
        await sdk.threads.create(thread_id=tid)
    assert err.value.response.status_code == 409
    same = await sdk.threads.create(thread_id=tid, if_exists="do_nothing", metadata={"n": 2})
    assert same["metadata"] == {"n": 1}


async def test_search_and_count(sdk: LangGraphClient) -> None:
    kind = uuid.uuid4().hex  # the module's app is shared: this test's threads are the ones of its kind
    ids = [(await sdk.threads.create(metadata={"kind": kind, "i": i}))["thread_id"] for i in range(3)]
    found = await sdk.threads.search(metadata={"kind": kind}, sort_by="created_at", sort_order="asc")
    assert [t["thread_id"] for t in found] == ids
    assert len(await sdk.threads.search(metadata={"kind": kind}, limit=2)) == 2
    assert [t["thread_id"] for t in await sdk.threads.search(ids=[ids[1]])] == [ids[1]]
    sel = await sdk.threads.search(ids=[ids[0]], select=["thread_id", "status"])
    assert sel == [{"thread_id": ids[0], "status": "idle"}]
    assert await sdk.threads.count(metadata={"kind": kind}) == 3
    assert await sdk.threads.count(metadata={"kind": kind}, status="busy") == 0
    assert [t["thread_id"] for t in await sdk.threads.search(metadata={"kind": kind}, status="idle",
                                                             sort_order="asc")] == ids


async def test_state_history_update_and_copy(sdk: LangGraphClient) -> None:
    t = await sdk.threads.create()
    tid = t["thread_id"]
    empty = await sdk.threads.get_state(tid)
    assert empty["values"] == {} and empty["next"] == [] and empty["checkpoint"] is None
    await sdk.runs.wait(tid, "counter", input={"increment": 2, "tag": "a"})
    await sdk.runs.wait(tid, "counter", input={"increment": 3, "tag": "b"})
    state = await sdk.threads.get_state(tid)
    assert one_state(state["values"])["count"] == 5 and one_state(state["values"])["log"] == ["a", "b"]
    thread = await sdk.threads.get(tid)
    assert thread["values"]["count"] == 5 and thread["status"] == "idle"
    assert thread["metadata"]["graph_id"] == "counter"
    history = await sdk.threads.get_history(tid)
    assert len(history) >= 4 and history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    limited = await sdk.threads.get_history(tid, limit=2)
    assert len(limited) == 2
    # `before` as LangGraph's history returns it (a RunnableConfig), and as a bare id.
    as_config = await sdk.threads.get_history(
        tid, before={"configurable": history[0]["checkpoint"]}, limit=1)  # type: ignore[arg-type]  # SDK: no config type
    assert as_config[0]["checkpoint"]["checkpoint_id"] == history[1]["checkpoint"]["checkpoint_id"]
    as_str = await sdk.threads.get_history(tid, before=history[0]["checkpoint"]["checkpoint_id"], limit=1)
    assert as_str == as_config
    before = await sdk.threads.get_history(tid, before=history[0]["checkpoint"], limit=1)
    assert before[0]["checkpoint"]["checkpoint_id"] == history[1]["checkpoint"]["checkpoint_id"]
    # An earlier checkpoint is readable by id.
    old = await sdk.threads.get_state(tid, checkpoint_id=history[-1]["checkpoint"]["checkpoint_id"])
    assert old["checkpoint"]["checkpoint_id"] == history[-1]["checkpoint"]["checkpoint_id"]
    # Update writes a new revision.
    updated = await sdk.threads.update_state(tid, {"count": 10}, as_node="count")
    assert updated["checkpoint"]["checkpoint_id"]
    assert one_state((await sdk.threads.get_state(tid))["values"])["count"] == 15
    assert (await sdk.threads.get(tid))["values"]["count"] == 15
    # Copy carries state and history.
    copy = await copy_thread(sdk, tid)
    assert copy["thread_id"] != tid
    assert one_state((await sdk.threads.get_state(copy["thread_id"]))["values"])["count"] == 15
    assert len(await sdk.threads.get_history(copy["thread_id"], limit=100)) == len(
        await sdk.threads.get_history(tid, limit=100))


async def test_large_values_read_again_are_never_stale(sdk: LangGraphClient, runtime: Any, backend: Any) -> None:
    """On PostgreSQL a large channel value, once read, is kept by the process (`storage/blob_cache.py`) and
    not fetched again: after an update of it, a delete and a new thread of the same id, or a copy, each read
    still gives the state as stored."""
    big = ["a" * 70_000], ["b" * 70_000], ["c" * 70_000], ["d" * 70_000]  # each past the 64 KiB kept
    tid = str(uuid.uuid4())
    supersteps: list[dict[str, Sequence[dict[str, Any]]]] = [
        {"updates": [{"values": {"log": big[0], "count": 1}, "as_node": "count"}]}]
    await sdk.threads.create(thread_id=tid, graph_id="counter", supersteps=supersteps)
    assert one_state((await sdk.threads.get_state(tid))["values"])["log"] == big[0]
    cache = getattr(runtime.storage.checkpointer, "blob_cache", None)
    if backend.kind == "postgres":  # the cache is there, and holds the thread's log
        assert cache is not None and any(k[0] == "log" for k in cache.held(tid, ""))
    assert one_state((await sdk.threads.get_state(tid))["values"])["log"] == big[0]
    await sdk.threads.update_state(tid, {"log": big[1]}, as_node="count")
    assert one_state((await sdk.threads.get_state(tid))["values"])["log"] == big[0] + big[1]
    assert (await sdk.threads.get(tid))["values"]["log"] == big[0] + big[1]

    await sdk.threads.delete(tid)
    again: list[dict[str, Sequence[dict[str, Any]]]] = [
        {"updates": [{"values": {"log": big[2], "count": 1}, "as_node": "count"}]}]
    await sdk.threads.create(thread_id=tid, graph_id="counter", supersteps=again)
    assert one_state((await sdk.threads.get_state(tid))["values"])["log"] == big[2]

    copy = (await copy_thread(sdk, tid))["thread_id"]
    assert one_state((await sdk.threads.get_state(copy))["values"])["log"] == big[2]
    await sdk.threads.update_state(copy, {"log": big[3]}, as_node="count")
    assert one_state((await sdk.threads.get_state(copy))["values"])["log"] == big[2] + big[3]
    assert one_state((await sdk.threads.get_state(tid))["values"])["log"] == big[2]
    history = await sdk.threads.get_history(copy, limit=10)
    assert [one_state(h["values"])["log"] for h in history[:2]] == [big[2] + big[3], big[2]]


async def test_each_history_entry_is_the_state_at_its_checkpoint(sdk: LangGraphClient) -> None:
    """History is read in one go (checkpoints and their pending writes); each entry must still be what
    reading the state at that checkpoint shows, with the interrupt a pending write holds."""
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "counter", input={"increment": 2, "tag": "a"})
    await sdk.runs.wait(tid, "approval", input={"request": "deploy"})
    history = await sdk.threads.get_history(tid, limit=100)
    assert len(history) >= 4
    assert history[0]["tasks"][0]["interrupts"], history[0]["tasks"]  # the interrupt is a pending write
    for entry in history:
        assert entry == await sdk.threads.get_state(tid, checkpoint_id=entry["checkpoint"]["checkpoint_id"])
    filtered = await sdk.threads.get_history(tid, limit=100, metadata={"source": "loop"})
    assert filtered and all(e["metadata"]["source"] == "loop" for e in filtered)
    assert [wire(e)["checkpoint_id"] for e in filtered] == [wire(e)["checkpoint_id"] for e in history
                                                       if e["metadata"]["source"] == "loop"]


async def test_a_state_update_shows_in_the_thread_and_in_search_by_values(sdk: LangGraphClient) -> None:
    """The thread's row caches its latest values (thread reads and `values` search use them); a state update
    writes them without the thread being read whole again."""
    tid = (await sdk.threads.create())["thread_id"]
    big = "x" * 200_000  # a large state: the row's values are written, not read back
    await sdk.runs.wait(tid, "counter", input={"increment": 2, "tag": big})
    await sdk.threads.update_state(tid, {"log": ["marked"]}, as_node="count")
    thread = await sdk.threads.get(tid)
    state = await sdk.threads.get_state(tid)
    assert thread["values"] == state["values"] and state["values"]["log"] == [big, "marked"]
    assert thread["status"] == "idle" and thread["updated_at"] > thread["created_at"]
    found = await sdk.threads.search(values={"count": 2}, metadata={"graph_id": "counter"}, limit=100)
    assert tid in [t["thread_id"] for t in found]
    assert [t["values"] for t in found if t["thread_id"] == tid] == [state["values"]]
    await sdk.threads.update_state(tid, {"count": 5}, as_node="count")
    assert tid not in [t["thread_id"] for t in await sdk.threads.search(values={"count": 2}, limit=100)]
    assert tid in [t["thread_id"] for t in await sdk.threads.search(values={"count": 7}, limit=100)]
    copy = await copy_thread(sdk, tid)
    assert copy["values"] == (await sdk.threads.get_state(tid))["values"]


def _fields(state: ThreadState) -> dict[str, Any]:
    """What a thread's row should cache of `state` (its values, pending interrupts and the status they imply)."""
    interrupts = {t["id"]: t["interrupts"] for t in state["tasks"] if t["interrupts"]}
    return {"values": state["values"], "interrupts": interrupts,
            "status": "interrupted" if interrupts or state["next"] else "idle"}


async def test_after_each_kind_of_state_update_the_thread_caches_its_latest_state(sdk: LangGraphClient) -> None:
    """The thread's fields after an update come from the checkpoint the update wrote (`core/remembered.py`),
    not from reading it back: they must be what reading the latest state shows, whatever the update."""
    async def check(tid: str) -> None:
        thread, state = await sdk.threads.get(tid), await sdk.threads.get_state(tid)
        assert {k: thread[k] for k in ("values", "interrupts", "status")} == _fields(state)

    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "approval", input={"request": "deploy"})  # waits on an interrupt in `ask`
    await check(tid)
    assert (await sdk.threads.get(tid))["status"] == "interrupted"
    await sdk.threads.update_state(tid, {"request": "deploy twice"})  # as the last node that wrote: `ask`
    await check(tid)
    await sdk.threads.update_state(tid, {"approved": True}, as_node="ask")  # `act` is next
    await check(tid)
    assert (await sdk.threads.get_state(tid))["next"] == ["act"]
    await sdk.threads.update_state(tid, {"outcome": "skipped"}, as_node="act")  # nothing left to run
    await check(tid)
    assert (await sdk.threads.get(tid))["status"] == "idle"
    # An update made at an earlier checkpoint forks from it: the fork is the thread's latest state.
    first = (await sdk.threads.get_history(tid, limit=100))[-2]
    await sdk.threads.update_state(tid, {"request": "forked"}, as_node="ask",
                                   checkpoint_id=first["checkpoint"]["checkpoint_id"])
    await check(tid)
    assert (await sdk.threads.get(tid))["values"]["request"] == "forked"
    # Through a reducer, on a graph with a subgraph node next.
    nested = (await sdk.threads.create())["thread_id"]
    start: dict[str, Any] = {"items": ["a"]}
    await sdk.runs.wait(nested, "nested", input=start)
    await sdk.threads.update_state(nested, {"items": ["b"]}, as_node="parent_step")
    await check(nested)
    assert (await sdk.threads.get(nested))["values"]["items"][-1] == "b"


async def test_a_state_update_reads_its_checkpoint_once(sdk: LangGraphClient, runtime: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The update reads the latest checkpoint to apply the change to; the thread's fields are built from the
    one it wrote, which is not read back (on a 1 MB state, a second load of the whole checkpoint)."""
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "counter", input={"increment": 2, "tag": "a"})
    saver = runtime.storage.checkpointer
    reads: list[Any] = []
    read = saver.aget_tuple

    async def counted(config: Any) -> Any:
        if config["configurable"]["thread_id"] == tid:
            reads.append(config["configurable"].get("checkpoint_id"))
        return await read(config)

    monkeypatch.setattr(saver, "aget_tuple", counted)
    await sdk.threads.update_state(tid, {"count": 5}, as_node="count")
    assert reads == [None]
    monkeypatch.undo()
    assert (await sdk.threads.get(tid))["values"]["count"] == 7


async def test_a_state_update_converts_the_whole_values_once_and_the_row_is_the_state(
        sdk: LangGraphClient, runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state update writes the thread's values whole on both backends (JSON text; PostgreSQL's `json`,
    migration 0019), converted once. Also when the row held other values (written by hand): the row is the
    state either way."""
    from threadline import serde
    from threadline.core import state as state_module

    tid = (await sdk.threads.create())["thread_id"]
    big = ["x" * 1_000] * 50
    await sdk.runs.wait(tid, "counter", input={"increment": 2, "tag": "a"})
    await sdk.threads.update_state(tid, {"log": big}, as_node="count")
    converted: list[Any] = []
    convert = serde.to_jsonable  # as `core/state.py` imports it

    def counted(obj: Any) -> Any:
        converted.append(obj)
        return convert(obj)

    monkeypatch.setattr(state_module, "to_jsonable", counted)
    await sdk.threads.update_state(tid, {"count": 5}, as_node="count")
    assert len([v for v in converted if isinstance(v, dict) and "log" in v]) == 1
    state = await sdk.threads.get_state(tid)
    assert (await sdk.threads.get(tid))["values"] == state["values"] and state["values"]["count"] == 7

    await runtime.storage.update_thread(tid, {"values": {"by": "hand"}})
    converted.clear()
    await sdk.threads.update_state(tid, {"count": 1}, as_node="count")
    assert len([v for v in converted if isinstance(v, dict) and "log" in v]) == 1
    state = await sdk.threads.get_state(tid)
    assert (await sdk.threads.get(tid))["values"] == state["values"] and state["values"]["count"] == 8
    assert state["values"]["log"][-50:] == big


async def test_spec_history_and_patch_values(http: httpx.AsyncClient, sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "counter", input={"increment": 1, "tag": "a"})
    r = await http.get(f"/threads/{tid}/history", params={"limit": 2})
    assert r.status_code == 200 and len(r.json()) == 2 and r.json()[0]["checkpoint"]["checkpoint_id"]
    r = await http.patch(f"/threads/{tid}", json={"values": {"count": 4}, "metadata": {"m": 1}})
    assert r.status_code == 200 and r.json()["metadata"]["m"] == 1
    assert r.json()["values"]["count"] == 5


async def test_prune(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    for tag in "ab":
        await sdk.runs.wait(tid, "counter", input={"tag": tag})
    assert len(await sdk.threads.get_history(tid, limit=100)) > 1
    r = await http.post("/threads/prune", json={"thread_ids": [tid], "strategy": "keep_latest"})
    assert r.status_code == 200 and r.json() == {"pruned_count": 1}
    assert len(await sdk.threads.get_history(tid, limit=100)) == 1
    assert one_state((await sdk.threads.get_state(tid))["values"])["log"] == ["a", "b"]


async def test_errors(http: httpx.AsyncClient) -> None:
    missing = uuid.uuid4()
    r = await http.get(f"/threads/{missing}")
    assert r.status_code == 404 and r.json()["code"] == "not_found" and r.json()["message"]
    assert (await http.get("/threads/not-a-uuid")).status_code == 422
    assert (await http.post("/threads", json={"thread_id": "nope"})).status_code == 422
    assert (await http.post("/threads/search", json={"limit": 0})).status_code == 422
    assert (await http.post("/threads/search", json={"status": "weird"})).status_code == 422
    assert (await http.delete(f"/threads/{missing}")).status_code == 404
    assert (await http.post(f"/threads/{missing}/copy")).status_code == 404
    assert (await http.get(f"/threads/{missing}/state")).status_code == 404
    r = await http.post("/threads", json={})
    tid = r.json()["thread_id"]
    r = await http.post(f"/threads/{tid}/state", json={"values": {"a": 1}})
    assert r.status_code == 400 and "graph" in r.json()["detail"]


async def test_supersteps_seed_state(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    t = await sdk.threads.create(graph_id="counter", supersteps=[
        {"updates": [{"values": {"count": 5, "log": ["seed"]}, "as_node": "count"}]},
        {"updates": [{"values": {"count": 1, "log": ["more"]}, "as_node": "count"}]},
    ])
    assert t["values"] == {"count": 6, "log": ["seed", "more"]} and t["metadata"]["graph_id"] == "counter"
    assert len(await sdk.threads.get_history(t["thread_id"], limit=100)) == 2
    # Kept as it was when it already exists.
    again = await sdk.threads.create(thread_id=t["thread_id"], if_exists="do_nothing", graph_id="counter",
                                     supersteps=[{"updates": [{"values": {"count": 100}, "as_node": "count"}]}])
    assert again["values"]["count"] == 6
    r = await http.post("/threads", json={"supersteps": [{"updates": [{"values": {}}]}]})
    assert r.status_code == 400 and "graph_id" in r.json()["detail"]
    threads = await sdk.threads.count(metadata={"graph_id": "counter"})
    r = await http.post("/threads", json={"graph_id": "counter", "supersteps": [
        {"updates": [{"values": {"count": 1}, "as_node": "nope"}]}]})
    assert r.status_code == 400
    assert await sdk.threads.count(metadata={"graph_id": "counter"}) == threads  # the failed one left nothing


async def test_fields_nobody_defines_are_ignored(http: httpx.AsyncClient) -> None:
    """As LangGraph's server (tests/test_request_fields.py has the rule for every body)."""
    r = await http.post("/threads", json={"ttl": {"ttl": 5}, "expires": "tomorrow"})
    assert r.status_code == 200 and "expires" not in r.json()
    r = await http.post("/threads", json={"ttl": {"ttl": 5}})  # thread TTLs are honoured: tests/test_ttl.py
    assert r.status_code == 200 and r.json()["thread_id"]


async def test_update_state_bad_node(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "counter", input={})
    r = await http.post(f"/threads/{tid}/state", json={"values": {"count": 1}, "as_node": "nope"})
    assert r.status_code == 400 and "nope" in r.json()["detail"]


async def test_delete_thread_stops_its_running_run(sdk: LangGraphClient) -> None:

    from tests.project.agents import WORK_LOG

    tid = (await sdk.threads.create())["thread_id"]
    tag = uuid.uuid4().hex
    run = await sdk.runs.create(tid, "slow", input={"tag": tag, "steps": 200, "delay": 0.02})
    await until(logged(WORK_LOG, tag))
    await sdk.threads.delete(tid)
    done = len([w for w in WORK_LOG if w.startswith(tag)])
    await agent_stopped(tag)
    assert len([w for w in WORK_LOG if w.startswith(tag)]) == done < 200
    with pytest.raises(httpx.HTTPStatusError) as err:
        await sdk.runs.get(tid, run["run_id"])
    assert err.value.response.status_code == 404
