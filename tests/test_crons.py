"""Crons through langgraph-sdk on every backend: each call and field, errors, and the scheduler's ticks.

Time is the scheduler's injected clock (`Crons.clock`), moved by the tests; `Crons.run_due()` runs one pass
of the scheduler (the loop's own passes, on the same clock, are serialized with it, so a test sees one whole
pass at a time).

The module's tests share one started app per backend (tests/shared_app.py): the `clock` fixture deletes every
cron an earlier test left and lets the scheduler's pass in flight end, so a test that takes it may count and
list every cron, and reads the scheduler's metrics as a difference (`_created`). The tests that restart an app, or
start one with other settings, start their own on `own_backend`.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import OnCompletionBehavior

from tests.conftest import PROJECT
from tests.sdk_shapes import as_cron, one_state
from tests.services import Backend
from tests.shared_app import shared_app
from threadline.api.app import create_app
from threadline.core.crons import CLAIM_SECONDS, Crons, Schedule, iso, tick_run_id
from threadline.core.runtime import Runtime
from threadline.settings import Settings
from threadline.storage.records import RunRecord

UTC = UTC
pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the mark above reaches the one plain function too (test_schedule_semantics), which runs as one
              pytest.mark.filterwarnings("ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async")]

backend, served, http = shared_app()
#: A start well after today, so the loop's real-clock passes before a test moves the clock never fire; at 01:01:10
#: of a day, so which schedule fires first never depends on the day's wall clock (ties would order at random).
START = (datetime.now(UTC) + timedelta(days=365)).replace(hour=1, minute=1, second=10, microsecond=0)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def _crons(rt: Runtime) -> Crons:
    assert rt.crons is not None
    return rt.crons


@pytest_asyncio.fixture(loop_scope="module")
async def clock(runtime: Runtime, sdk: LangGraphClient) -> Clock:
    """The scheduler's clock, at START, over no cron: those of earlier tests on the shared app are deleted."""
    while earlier := await sdk.crons.search(limit=1000, select=["cron_id"]):
        for cron in earlier:
            await sdk.crons.delete(cron["cron_id"])
    c = Clock(START)
    _crons(runtime).clock = c
    await _crons(runtime).run_due()  # serialized with the loop's pass: one in flight over a deleted cron has ended
    return c


@pytest.fixture
def held(clock: Clock) -> None:
    """The shared app's scheduler held in the past, for a test that starts an app of its own: on PostgreSQL
    they share the crons, and the shared app's loop must not fire (and move on) one the test's app awaits."""
    clock.now = datetime(2000, 1, 1, tzinfo=UTC)


async def _created(sdk: LangGraphClient) -> dict[str, int]:
    """The runs the scheduler created so far, by kind ("thread", "stateless"): shared by the module's tests."""
    created: dict[str, int] = (await sdk.http.get("/metrics?format=json"))["crons"]["runs_created"]
    return created


async def _cron_runs(rt: Runtime, cron_id: str, *, finished: bool = True) -> list[RunRecord]:
    """Every run the cron created (newest first), once they have finished (unless `finished=False`)."""
    runs = await rt.storage.search_runs(thread_id=None, assistant_id=None, status=None,
                                        metadata={"cron_id": cron_id}, limit=1000, offset=0)
    for run in runs if finished else ():
        await rt.runs.wait(run["run_id"])
    return runs


def _iso(moment: datetime) -> str:
    return moment.isoformat()


# --- the calls and their fields ----------------------------------------------------------------

async def test_thread_cron_create_get_update_delete(sdk: LangGraphClient, clock: Clock) -> None:
    thread = await sdk.threads.create()
    tid = thread["thread_id"]
    cron = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="*/5 * * * *", input={"increment": 1},
                                                     metadata={"k": "v"}, config={"tags": ["t"]}, context={"c": 1},
                                                     interrupt_before=["count"], multitask_strategy="enqueue",
                                                     stream_mode=["values"], durability="sync"))
    assert set(cron) == {"cron_id", "assistant_id", "thread_id", "user_id", "end_time", "schedule", "timezone",
                         "payload", "next_run_date", "metadata", "on_run_completed", "enabled", "created_at",
                         "updated_at"}
    assistant = (await sdk.assistants.search(graph_id="counter"))[0]["assistant_id"]
    assert cron["assistant_id"] == assistant and cron["thread_id"] == tid
    assert cron["schedule"] == "*/5 * * * *" and cron["timezone"] is None and cron["end_time"] is None
    assert cron["enabled"] is True and cron["on_run_completed"] is None and cron["user_id"] == ""
    assert cron["metadata"] == {"k": "v"}
    # The first tick after the clock's now.
    expected = Schedule("*/5 * * * *").next_after(START)
    assert expected is not None and cron["next_run_date"] == _iso(expected)
    payload = cron["payload"]
    assert payload["input"] == {"increment": 1} and payload["assistant_id"] == assistant
    assert payload["config"] == {"tags": ["t"], "configurable": {"cron_id": cron["cron_id"]}}
    assert payload["context"] == {"c": 1} and payload["interrupt_before"] == ["count"]
    assert payload["multitask_strategy"] == "enqueue" and payload["durability"] == "sync"

    assert await sdk.http.get(f"/runs/crons/{cron['cron_id']}") == cron

    clock.advance(minutes=1)
    end = START + timedelta(days=2)
    updated = await sdk.crons.update(cron["cron_id"], schedule="0 * * * *", metadata={"k2": "v2"},
                                     input={"increment": 9}, end_time=end, timezone="Europe/Paris",
                                     on_run_completed="keep")
    assert updated["schedule"] == "0 * * * *" and updated["timezone"] == "Europe/Paris"
    assert updated["metadata"] == {"k": "v", "k2": "v2"}  # merged, as LangGraph's server
    assert updated["payload"]["metadata"] == {"k2": "v2"} and updated["payload"]["input"] == {"increment": 9}
    assert updated["payload"]["config"]["configurable"]["cron_id"] == cron["cron_id"]
    assert updated["end_time"] == _iso(end) and updated["on_run_completed"] == "keep"
    following = Schedule("0 * * * *", "Europe/Paris").next_after(clock.now)
    assert following is not None and updated["next_run_date"] == _iso(following)
    assert updated["created_at"] == cron["created_at"] and updated["updated_at"] > cron["updated_at"]

    cleared = await sdk.crons.update(cron["cron_id"], end_time=None, enabled=False)
    assert cleared["end_time"] is None and cleared["enabled"] is False

    await sdk.crons.delete(cron["cron_id"])
    for call in (sdk.http.get(f"/runs/crons/{cron['cron_id']}"), sdk.crons.delete(cron["cron_id"]),
                 sdk.crons.update(cron["cron_id"], enabled=True)):
        with pytest.raises(httpx.HTTPStatusError) as err:
            await call
        assert err.value.response.status_code == 404


async def test_stateless_cron_fields(sdk: LangGraphClient, clock: Clock) -> None:
    end = START + timedelta(days=3)
    cron = as_cron(await sdk.crons.create("counter", schedule="0 9 * * 1", input={"increment": 2},
                                          on_run_completed="keep", timezone="America/New_York", end_time=end,
                                          enabled=False))
    assert cron["thread_id"] is None and cron["on_run_completed"] == "keep" and cron["enabled"] is False
    assert cron["timezone"] == "America/New_York" and cron["end_time"] == _iso(end)
    nine_in_new_york = Schedule("0 9 * * 1", "America/New_York").next_after(START)
    assert nine_in_new_york is not None and cron["next_run_date"] == _iso(nine_in_new_york)
    assert nine_in_new_york.hour in (13, 14)  # 9:00 in New York, in UTC (summer or winter)
    default = as_cron(await sdk.crons.create("counter", schedule="@hourly"))
    assert default["on_run_completed"] == "delete"  # a stateless cron's default
    assert default["next_run_date"] == _iso(START.replace(minute=0, second=0) + timedelta(hours=1))


async def test_search_count_sort_select_page(sdk: LangGraphClient, clock: Clock) -> None:
    thread = (await sdk.threads.create())["thread_id"]
    made = []
    for i, schedule in enumerate(["*/10 * * * *", "0 * * * *", "*/2 * * * *"]):
        made.append(as_cron(await sdk.crons.create("counter", schedule=schedule, metadata={"kind": "s", "i": i})))
        clock.advance(seconds=1)
    on_thread = as_cron(await sdk.crons.create_for_thread(thread, "echo", schedule="0 0 * * *", enabled=False))
    ids = [c["cron_id"] for c in made]
    counter = made[0]["assistant_id"]

    everything = await sdk.crons.search(limit=100)
    assert [c["cron_id"] for c in everything] == [on_thread["cron_id"], *reversed(ids)]  # newest first
    assert [c["cron_id"] for c in await sdk.crons.search(assistant_id=counter, sort_by="created_at",
                                                         sort_order="asc")] == ids
    assert [c["cron_id"] for c in await sdk.crons.search(thread_id=thread)] == [on_thread["cron_id"]]
    assert [c["cron_id"] for c in await sdk.crons.search(enabled=False)] == [on_thread["cron_id"]]
    assert {c["cron_id"] for c in await sdk.crons.search(metadata={"kind": "s"})} == set(ids)
    assert [c["cron_id"] for c in await sdk.crons.search(metadata={"i": 1})] == [ids[1]]
    by_next = await sdk.crons.search(sort_by="next_run_date", sort_order="asc", select=["cron_id", "next_run_date"])
    assert [c["next_run_date"] for c in by_next] == sorted(c["next_run_date"] for c in by_next)
    assert all(set(c) == {"cron_id", "next_run_date"} for c in by_next)
    assert by_next[0]["cron_id"] == ids[2]  # every two minutes: the soonest
    page = await sdk.crons.search(assistant_id=counter, sort_by="created_at", sort_order="asc", limit=1, offset=1)
    assert [c["cron_id"] for c in page] == [ids[1]]

    response = await sdk.http.client.post("/runs/crons/search", json={"limit": 2})
    assert response.headers["X-Pagination-Total"] == "3" and response.headers["X-Pagination-Next"] == "2"

    assert await sdk.crons.count() == 4
    assert await sdk.crons.count(assistant_id=counter) == 3
    assert await sdk.crons.count(thread_id=thread) == 1
    assert await sdk.crons.count(metadata={"kind": "s"}) == 3


@pytest.mark.parametrize("schedule", ["not a cron", "61 * * * *", "* * * *", "* * 32 * *", "@sometimes", ""])
async def test_invalid_schedule_is_422_naming_it(sdk: LangGraphClient, schedule: str) -> None:
    for call in (sdk.crons.create("counter", schedule=schedule),
                 sdk.crons.create_for_thread((await sdk.threads.create())["thread_id"], "counter", schedule=schedule)):
        with pytest.raises(httpx.HTTPStatusError) as err:
            await call
        assert err.value.response.status_code == 422
        assert f"Invalid cron schedule: '{schedule}'" in err.value.response.json()["detail"]
    cron = as_cron(await sdk.crons.create("counter", schedule="* * * * *"))
    with pytest.raises(httpx.HTTPStatusError) as err:
        await sdk.crons.update(cron["cron_id"], schedule=schedule or " ")
    assert err.value.response.status_code == 422 and "Invalid cron schedule" in err.value.response.json()["detail"]
    assert (await sdk.http.get(f"/runs/crons/{cron['cron_id']}"))["schedule"] == "* * * * *"  # unchanged


async def test_bad_requests(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    cases = [
        ("/runs/crons", {"assistant_id": "counter", "schedule": "* * * * *", "timezone": "Not/AZone"}, 422,
         "Invalid timezone: 'Not/AZone'"),
        ("/runs/crons", {"schedule": "* * * * *"}, 422, "assistant_id"),
        ("/runs/crons", {"assistant_id": "counter"}, 422, "schedule"),
        ("/runs/crons", {"assistant_id": "counter", "schedule": "* * * * *", "on_run_completed": "never"}, 422,
         "on_run_completed"),
        ("/runs/crons", {"assistant_id": "counter", "schedule": 5}, 422, "schedule"),
        (f"/threads/{uuid.uuid4()}/runs/crons", {"assistant_id": "counter", "schedule": "* * * * *"}, 404, "Thread"),
        ("/runs/crons/search", {"sort_by": "bogus"}, 422, "sort_by"),
        ("/runs/crons/search", {"select": ["bogus"]}, 422, "select"),
        ("/runs/crons/search", {"assistant_id": "counter"}, 422, "assistant_id"),
    ]
    for path, body, status, named in cases:
        response = await http.post(path, json=body)
        assert response.status_code == status, (path, body, response.text)
        assert named in response.json()["detail"], (body, response.json())
    assert (await http.post("/runs/crons", json={"assistant_id": str(uuid.uuid4()),
                                                 "schedule": "* * * * *"})).status_code == 404
    assert (await http.get("/runs/crons/not-a-uuid")).status_code == 422
    assert (await http.get("/info")).json()["flags"]["crons"] is True


# --- the scheduler -----------------------------------------------------------------------------

async def test_thread_cron_fires_once_per_tick(sdk: LangGraphClient, runtime: Runtime, clock: Clock) -> None:
    tid = (await sdk.threads.create(metadata={"owner": "me"}))["thread_id"]
    cron = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="* * * * *",
                                                     input={"increment": 1, "tag": "c"}, metadata={"m": 1}))
    crons = _crons(runtime)
    before = await _created(sdk)
    await crons.run_due()
    assert await _cron_runs(runtime, cron["cron_id"]) == []  # not due yet
    for minute in range(1, 4):
        clock.advance(minutes=1)
        await crons.run_due()
        await crons.run_due()  # a second pass finds nothing more to do
        runs = await _cron_runs(runtime, cron["cron_id"])
        assert len(runs) == minute
    run = runs[0]
    assert run["thread_id"] == tid and run["metadata"]["cron_id"] == cron["cron_id"]
    assert run["metadata"]["m"] == 1 and run["metadata"]["owner"] == "me"  # the thread's metadata, as any run
    assert run["kwargs"]["config"]["configurable"]["cron_id"] == cron["cron_id"]
    state = await sdk.threads.get_state(tid)
    assert one_state(state["values"])["count"] == 3  # each tick's run ran on the cron's thread
    got = await sdk.http.get(f"/runs/crons/{cron['cron_id']}")
    assert got["next_run_date"] == _iso(START.replace(second=0) + timedelta(minutes=4))
    assert got["updated_at"] == cron["updated_at"]  # firing is not an update
    assert (await _created(sdk)).get("thread", 0) - before.get("thread", 0) == 3


async def test_missed_period_fires_once_and_moves_on(sdk: LangGraphClient, runtime: Runtime, clock: Clock) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    cron = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="* * * * *", input={"increment": 1}))
    clock.advance(hours=5)  # 300 ticks missed
    await _crons(runtime).run_due()
    assert len(await _cron_runs(runtime, cron["cron_id"])) == 1
    got = await sdk.http.get(f"/runs/crons/{cron['cron_id']}")
    assert got["next_run_date"] == _iso(clock.now.replace(second=0) + timedelta(minutes=1))


async def test_disabled_and_ended_crons_do_not_fire(sdk: LangGraphClient, runtime: Runtime, clock: Clock) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    off = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="* * * * *", input={"increment": 1},
                                                    enabled=False))
    ending = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="* * * * *", input={"increment": 10},
                                                       end_time=START + timedelta(minutes=2, seconds=30)))
    crons = _crons(runtime)
    for _ in range(5):
        clock.advance(minutes=1)
        await crons.run_due()
    assert await _cron_runs(runtime, off["cron_id"]) == []
    assert len(await _cron_runs(runtime, ending["cron_id"])) == 2  # the ticks before its end_time
    # Enabled again: from the next tick after now, not the stale one.
    enabled = await sdk.crons.update(off["cron_id"], enabled=True)
    assert enabled["next_run_date"] == _iso(clock.now.replace(second=0) + timedelta(minutes=1))
    await crons.run_due()
    assert await _cron_runs(runtime, off["cron_id"]) == []
    clock.advance(minutes=1)
    await crons.run_due()
    assert len(await _cron_runs(runtime, off["cron_id"])) == 1
    # An end_time moved on lets it fire again.
    await sdk.crons.update(ending["cron_id"], end_time=None)
    clock.advance(minutes=1)
    await crons.run_due()
    assert len(await _cron_runs(runtime, ending["cron_id"])) == 3


@pytest.mark.parametrize("on_run_completed", ["delete", "keep"])
async def test_stateless_cron_thread_per_run(sdk: LangGraphClient, runtime: Runtime, clock: Clock,
                                             on_run_completed: OnCompletionBehavior) -> None:
    cron = as_cron(await sdk.crons.create("counter", schedule="* * * * *", input={"increment": 1},
                                          on_run_completed=on_run_completed, metadata={"job": "nightly"}))
    crons = _crons(runtime)
    before = await _created(sdk)
    for _ in range(2):
        clock.advance(minutes=1)
        await crons.run_due()
    runs = await _cron_runs(runtime, cron["cron_id"])
    assert len(runs) == 2 and len({r["thread_id"] for r in runs}) == 2  # a new thread each time
    assert all(r["status"] == "success" for r in [await runtime.storage.get_run(r["run_id"]) for r in runs])
    for run in runs:
        thread = await runtime.storage.get_thread(run["thread_id"])
        if on_run_completed == "delete":
            assert thread is None
        else:
            assert thread is not None and thread["metadata"]["job"] == "nightly"
            assert one_state((await sdk.threads.get_state(run["thread_id"]))["values"])["count"] == 1
    assert (await _created(sdk)).get("stateless", 0) - before.get("stateless", 0) == 2


async def test_thread_cron_meets_the_multitask_strategy(sdk: LangGraphClient, runtime: Runtime,
                                                        clock: Clock) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    # Busy until the test cancels it (100 s at most: the test's own timeout ends it before)
    busy = await sdk.runs.create(tid, "slow", input={"tag": "long", "steps": 2000, "delay": 0.05})
    rejecting = as_cron(await sdk.crons.create_for_thread(tid, "slow", schedule="* * * * *",
                                                          input={"tag": "r", "steps": 1}, multitask_strategy="reject"))
    queued = as_cron(await sdk.crons.create_for_thread(tid, "slow", schedule="* * * * *",
                                                       input={"tag": "q", "steps": 1}, multitask_strategy="enqueue"))
    clock.advance(minutes=1)
    await _crons(runtime).run_due()
    assert await _cron_runs(runtime, rejecting["cron_id"]) == []  # the thread was busy: the tick is refused
    [queued_run] = await _cron_runs(runtime, queued["cron_id"], finished=False)
    assert queued_run["status"] == "pending"  # queued behind the busy run, not beside it
    await sdk.runs.cancel(tid, busy["run_id"])  # the busy run ends: the queued one runs next
    [queued_run] = await _cron_runs(runtime, queued["cron_id"])
    finished, run = [await runtime.storage.get_run(r) for r in (busy["run_id"], queued_run["run_id"])]
    assert finished is not None and run is not None
    assert finished["status"] == "interrupted" and run["status"] == "success"
    assert finished["updated_at"] <= run["updated_at"]
    # The refused tick is over: the cron moved on.
    got = await sdk.http.get(f"/runs/crons/{rejecting['cron_id']}")
    assert got["next_run_date"] == _iso(clock.now.replace(second=0) + timedelta(minutes=1))


async def test_deleting_a_thread_deletes_its_crons(sdk: LangGraphClient, runtime: Runtime, clock: Clock) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    mine = [as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="* * * * *")) for _ in range(2)]
    other = as_cron(await sdk.crons.create("counter", schedule="* * * * *"))
    await sdk.threads.delete(tid)
    assert await sdk.crons.count() == 1
    assert [c["cron_id"] for c in await sdk.crons.search()] == [other["cron_id"]]
    for cron in mine:
        assert await runtime.storage.get_cron(cron["cron_id"]) is None


async def test_deleting_an_assistant_deletes_its_crons(sdk: LangGraphClient, clock: Clock) -> None:
    assistant = await sdk.assistants.create("counter")
    await sdk.crons.create(assistant["assistant_id"], schedule="* * * * *")
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.crons.create_for_thread(tid, assistant["assistant_id"], schedule="* * * * *")
    kept = as_cron(await sdk.crons.create("counter", schedule="* * * * *"))  # the graph's own assistant
    assert await sdk.crons.count(assistant_id=assistant["assistant_id"]) == 2
    await sdk.assistants.delete(assistant["assistant_id"])
    assert [c["cron_id"] for c in await sdk.crons.search()] == [kept["cron_id"]]


async def test_a_claimer_that_died_after_creating_the_run_is_not_repeated(
        sdk: LangGraphClient, runtime: Runtime, clock: Clock) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    cron = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="* * * * *", input={"increment": 1}))
    crons = _crons(runtime)
    clock.advance(minutes=1)
    row = await runtime.storage.get_cron(cron["cron_id"])
    assert row is not None
    tick = row["next_run_date"]
    # What a process does before it dies: it claims the tick and creates the run, and never moves on.
    assert await runtime.storage.claim_cron_tick(cron["cron_id"], tick, now=iso(clock.now),
                                                 until=iso(clock.now + timedelta(seconds=30)))
    await crons._fire(row, tick)
    await crons.run_due()  # the claim still holds: nobody else takes the tick
    assert (await runtime.storage.get_cron(cron["cron_id"]))["next_run_date"] == tick
    clock.advance(seconds=31)  # the claim lapsed
    await crons.run_due()
    runs = await _cron_runs(runtime, cron["cron_id"])
    assert [r["run_id"] for r in runs] == [tick_run_id(cron["cron_id"], tick)]  # one run, not two
    assert (await runtime.storage.get_cron(cron["cron_id"]))["next_run_date"] > tick


async def test_concurrent_schedulers_fire_each_tick_once(sdk: LangGraphClient, runtime: Runtime,
                                                         clock: Clock) -> None:
    """Several schedulers on one database (as several processes), passing at once over the same ticks."""
    tid = (await sdk.threads.create())["thread_id"]
    cron = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="* * * * *", input={"increment": 1}))
    stateless = as_cron(await sdk.crons.create("counter", schedule="* * * * *", input={"increment": 1}))
    schedulers = [Crons(runtime.storage, runtime.runs, runtime.assistants, runtime.metrics, clock=clock)
                  for _ in range(4)]
    for _ in range(5):
        clock.advance(minutes=1)
        await asyncio.gather(*(s.run_due() for s in schedulers))
    assert len(await _cron_runs(runtime, cron["cron_id"])) == 5
    assert len(await _cron_runs(runtime, stateless["cron_id"])) == 5


class _LateCreate:
    """`Runs` whose `create` first lets `other` pass: a claimer whose claim lapsed while it was creating the
    tick's run, so that another claimer took the tick and made the run meanwhile."""

    def __init__(self, runs: Any, other: Crons) -> None:
        self.runs, self.other = runs, other

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        await self.other.run_due()
        return await self.runs.create(*args, **kwargs)


async def test_a_tick_whose_run_another_claimer_made_meanwhile_is_not_an_error(
        sdk: LangGraphClient, runtime: Runtime, clock: Clock) -> None:
    """A claim can lapse under a slow claimer (`CLAIM_SECONDS`): the next claimer takes the tick and makes its
    run. The first one's create then finds the run's id taken: that tick is done, not a failure (the pass goes
    on, the cron moves on once, one run). A full-loop CI run saw the shared app's scheduler and a test's meet so."""
    tid = (await sdk.threads.create())["thread_id"]
    cron = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="* * * * *", input={"increment": 1}))
    later = Clock(clock.now)
    fast = Crons(runtime.storage, runtime.runs, runtime.assistants, runtime.metrics, clock=later)
    slow = Crons(runtime.storage, runtime.runs, runtime.assistants, runtime.metrics, clock=clock)
    slow.runs = _LateCreate(runtime.runs, fast)  # type: ignore[assignment]  # a stand-in with `create` only
    clock.advance(minutes=1)
    later.advance(minutes=1, seconds=2 * CLAIM_SECONDS)  # past the slow claimer's claim
    assert await slow.run_due() == 0
    assert [r["run_id"] for r in await _cron_runs(runtime, cron["cron_id"])] == [
        tick_run_id(cron["cron_id"], iso(START.replace(minute=2, second=0)))]
    row = await runtime.storage.get_cron(cron["cron_id"])
    assert row is not None and row["next_run_date"] == iso(START.replace(minute=4, second=0))  # by the later pass


@pytest.mark.usefixtures("held")
async def test_restart_fires_the_missed_period_once(own_backend: Backend) -> None:
    """A cron whose ticks passed while no process ran fires once when one starts again, and moves on."""
    settings = Settings(config=str(PROJECT), workers=4, heartbeat_seconds=5.0, **own_backend.settings())
    start = datetime.now(UTC)
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                     base_url="http://threadline") as http:
            sdk = LangGraphClient(http)
            tid = (await sdk.threads.create())["thread_id"]
            cron = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="0 * * * *",
                                                             input={"increment": 1}))
    later = Clock(start + timedelta(days=2))  # 48 ticks while stopped
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        rt: Runtime = application.state.runtime
        _crons(rt).clock = later
        await _crons(rt).run_due()
        await _crons(rt).run_due()
        assert len(await _cron_runs(rt, cron["cron_id"])) == 1
        row = await rt.storage.get_cron(cron["cron_id"])
        assert row is not None
        after = datetime.fromisoformat(row["next_run_date"])
        assert later.now < after <= later.now + timedelta(hours=1)


async def test_storage_claims_a_tick_once_until_it_lapses(sdk: LangGraphClient, runtime: Runtime,
                                                          clock: Clock) -> None:
    """The storage contract under the scheduler: one claim per tick, retaken only after it lapsed, and a
    move-on from a tick that was rescheduled meanwhile is refused."""
    storage = runtime.storage
    cron = as_cron(await sdk.crons.create("counter", schedule="* * * * *"))
    row = await storage.get_cron(cron["cron_id"])
    assert row is not None
    tick, now = row["next_run_date"], clock.now + timedelta(minutes=1)
    assert [c["cron_id"] for c in await storage.due_crons(iso(now), 10)] == [cron["cron_id"]]
    until = iso(now + timedelta(seconds=30))
    claims = await asyncio.gather(*(storage.claim_cron_tick(cron["cron_id"], tick, now=iso(now), until=until)
                                    for _ in range(5)))
    assert claims.count(True) == 1
    assert await storage.due_crons(iso(now), 10) == []  # claimed: not due for anyone else
    later = iso(now + timedelta(seconds=31))
    assert await storage.claim_cron_tick(cron["cron_id"], tick, now=later, until=later)  # lapsed: retaken
    await sdk.crons.update(cron["cron_id"], schedule="*/5 * * * *")  # rescheduled meanwhile
    assert not await storage.advance_cron(cron["cron_id"], tick, "2100-01-01T00:00:00.000000+00:00")
    moved = await storage.get_cron(cron["cron_id"])
    assert moved is not None and moved["next_run_date"] != tick
    assert await storage.count_crons(assistant_id=None, thread_id=None, enabled=None, metadata=None) == 1


def test_schedule_semantics() -> None:
    """Six fields take seconds last (as LangGraph's server reads them), nicknames stand for their fields, and a
    timezone's wall clock is kept across daylight saving time; ticks come back in UTC."""
    monday = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)  # a Monday
    assert Schedule("0 9 * * 1 30").next_after(monday) == datetime(2026, 11, 30, 9, 0, 30, tzinfo=UTC)
    assert Schedule("* * * * * */10").next_after(monday) == datetime(2026, 11, 30, 8, 0, 10, tzinfo=UTC)
    assert Schedule("*/10 * * * * *").next_after(monday) == datetime(2026, 11, 30, 8, 0, 1, tzinfo=UTC)  # minutes
    assert Schedule("@hourly").next_after(monday) == datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    assert Schedule("@daily").next_after(monday) == datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
    assert Schedule("@weekly").next_after(monday) == datetime(2026, 12, 6, 0, 0, tzinfo=UTC)  # Sunday
    summer, winter = datetime(2026, 7, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)
    assert Schedule("0 9 * * *", "America/New_York").next_after(summer) == datetime(2026, 7, 1, 13, tzinfo=UTC)
    assert Schedule("0 9 * * *", "America/New_York").next_after(winter) == datetime(2026, 12, 1, 14, tzinfo=UTC)
    # Strictly after: a tick at exactly `moment` is not the next one.
    assert Schedule("* * * * *").next_after(monday) == monday + timedelta(minutes=1)


@pytest.mark.usefixtures("held")
async def test_a_crons_runs_run_as_its_creator(own_backend: Backend) -> None:
    """With authentication, the cron remembers who created it (`user_id`), and each of its runs runs as that
    caller, as the caller's own runs do."""
    key = "sk-cron-0123456789abcdef"
    settings = Settings(config=str(PROJECT), workers=2, api_keys=f"carol={key}", **own_backend.settings())
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        rt: Runtime = application.state.runtime
        clock = Clock(START)
        _crons(rt).clock = clock
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                     base_url="http://threadline", headers={"x-api-key": key}) as http:
            sdk = LangGraphClient(http)
            tid = (await sdk.threads.create())["thread_id"]
            cron = as_cron(await sdk.crons.create_for_thread(tid, "counter", schedule="* * * * *",
                                                             input={"increment": 1}))
            stateless = as_cron(await sdk.crons.create("counter", schedule="* * * * *", input={"increment": 1}))
            assert cron["user_id"] == stateless["user_id"] == "carol"
            clock.advance(minutes=1)
            await _crons(rt).run_due()
            for made in (cron, stateless):
                [run] = await _cron_runs(rt, made["cron_id"])
                configurable = run["kwargs"]["config"]["configurable"]
                assert configurable["langgraph_auth_user_id"] == configurable["user_id"] == "carol"
                assert configurable["langgraph_auth_user"]["identity"] == "carol"
            assert "auth_user" not in (await sdk.http.get(f"/runs/crons/{cron['cron_id']}"))
