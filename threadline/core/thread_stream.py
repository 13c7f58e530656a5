"""Following a thread: the events of each of its runs in turn, for as long as the client listens.

`GET /threads/{thread_id}/stream` (langgraph-sdk `threads.join_stream`). The stream never ends on its
own: after a run it waits for the thread's next one. Event ids are `<run_id>/<run event id>` (and
`<run_id>/done` for the end-of-run marker), so `Last-Event-ID` resumes inside the run it names and then
goes on through the runs that came after it, replaying whatever their buffers still hold. LangGraph's
server resumes nothing on this endpoint; we do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from threadline.broker.base import StreamEvent
from threadline.core.runs import TERMINAL, Runs, thread_signal
from threadline.serde import dumps
from threadline.storage.base import Storage
from threadline.storage.records import RunRecord

THREAD_STREAM_MODES = ("run_modes", "lifecycle", "state_update")
#: How long a follower sleeps between checks for a new run when no signal arrives (a lost signal's cost).
IDLE_RECHECK_SECONDS = 15.0


def _wanted(event: str, modes: set[str]) -> bool:
    if "run_modes" in modes:
        return True
    if "lifecycle" in modes and event == "metadata":
        return True
    return "state_update" in modes and event.split("|", 1)[0] == "values"


async def follow_thread(runs: Runs, thread_id: str, *, modes: Iterable[str] = ("run_modes",),
                        last_event_id: str | None = None) -> AsyncIterator[StreamEvent]:
    """Events of the thread's runs, one run after another, from now (or after `last_event_id`) on.

    "Now" is when this returns, before the response begins: a client that has the response's headers and then
    creates a run gets that run from its start. (Fixed on the first event instead, a run created in between was
    already counted as past, and a quick one was missed whole.)"""
    start = await _start(runs.storage, thread_id, last_event_id)
    return _follow(runs, thread_id, set(modes) or {"run_modes"}, start)


async def _follow(runs: Runs, thread_id: str, wanted: set[str],
                  start: tuple[RunRecord | None, str | None, int, bool]) -> AsyncIterator[StreamEvent]:
    storage, broker = runs.storage, runs.broker
    run, after, cursor, live = start
    while True:
        # Listen before looking, so a run enqueued in between still wakes us.
        listen = broker.listen_run_done(thread_signal(thread_id))
        if run is None:
            run = await storage.next_run(thread_id, cursor)
            if run is None:
                await listen(IDLE_RECHECK_SECONDS)
                continue
            after = None
        run_id = run["run_id"]
        # A run we arrived at from a cursor is replayed from its start; one we joined live, from now.
        async for ev in runs.stream(run_id, last_event_id=after, replay=after is None and not live):
            if _wanted(ev.event, wanted):
                yield StreamEvent(f"{run_id}/{ev.id}", ev.event, ev.data)
        final = await storage.get_run(run_id)
        if (final is None or final["status"] in TERMINAL) and _wanted("metadata", wanted):
            yield StreamEvent(f"{run_id}/done", "metadata", dumps({"status": "run_done", "run_id": run_id}))
        cursor, run, after, live = run["seq"], None, None, False


async def _start(storage: Storage, thread_id: str,
                 last_event_id: str | None) -> tuple[RunRecord | None, str | None, int, bool]:
    """(run to begin with, event id to resume after, seq cursor, whether that run is joined live)."""
    if last_event_id and "/" in last_event_id:
        run_id, _, event_id = last_event_id.partition("/")
        run = await storage.get_run(run_id)
        if run is not None and run["thread_id"] == thread_id:
            if event_id == "done":
                return None, None, run["seq"], False
            return run, event_id, run["seq"], False
    active = await storage.active_runs(thread_id)
    if active:  # a running one is joined live (only what comes next); a pending one from its start
        return active[0], None, active[0]["seq"], active[0]["status"] == "running"
    return None, None, await storage.last_run_seq(thread_id), False
