"""Following a thread: the events of each of its runs in turn, for as long as the client listens.

`GET /threads/{thread_id}/stream` (langgraph-sdk `threads.join_stream`). The stream never ends on its
own: after a run it waits for the thread's next one. Event ids are `<run_id>/<run event id>` (and
`<run_id>/done` for the end-of-run marker), so `Last-Event-ID` resumes inside the run it names and then
goes on through the runs that came after it, replaying whatever their buffers still hold. LangGraph's
server resumes nothing on this endpoint; we do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from threadline.broker.base import StreamEvent
from threadline.serde import dumps
from threadline.storage.base import Row

THREAD_STREAM_MODES = ("run_modes", "lifecycle", "state_update")
#: How long a follower sleeps between checks for a new run when no signal arrives (a lost signal's cost).
IDLE_RECHECK_SECONDS = 15.0


def thread_signal(thread_id: str) -> str:
    """The key, in the broker's run-done signal space, that announces a new run on a thread."""
    return f"thread:{thread_id}"


def _wanted(event: str, modes: set[str]) -> bool:
    if "run_modes" in modes:
        return True
    if "lifecycle" in modes and event == "metadata":
        return True
    return "state_update" in modes and event.split("|", 1)[0] == "values"


async def follow_thread(runs: Any, thread_id: str, *, modes: Iterable[str] = ("run_modes",),
                        last_event_id: str | None = None) -> AsyncIterator[StreamEvent]:
    """Events of the thread's runs, one run after another, from now (or after `last_event_id`) on."""
    storage, broker = runs.storage, runs.broker
    wanted = set(modes) or {"run_modes"}
    run, after, cursor = await _start(storage, thread_id, last_event_id)
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
        replay = after is None and run.get("_joined") is not True
        async for ev in runs.stream(run_id, last_event_id=after, replay=replay):
            if _wanted(ev.event, wanted):
                yield StreamEvent(f"{run_id}/{ev.id}", ev.event, ev.data)
        final = await storage.get_run(run_id)
        if final is None or final["status"] in ("success", "error", "timeout", "interrupted"):
            if _wanted("metadata", wanted):
                yield StreamEvent(f"{run_id}/done", "metadata", dumps({"status": "run_done", "run_id": run_id}))
        cursor, run, after = run["seq"], None, None


async def _start(storage: Any, thread_id: str, last_event_id: str | None) -> tuple[Row | None, str | None, int]:
    """(run to begin with, event id to resume after, seq cursor)."""
    if last_event_id and "/" in last_event_id:
        run_id, _, event_id = last_event_id.partition("/")
        run = await storage.get_run(run_id)
        if run is not None and run["thread_id"] == thread_id:
            if event_id == "done":
                return None, None, run["seq"]
            return run, event_id, run["seq"]
    active = await storage.active_runs(thread_id)
    if active:
        current = active[0]
        if current["status"] == "running":
            current = {**current, "_joined": True}  # join it live: only what comes next
        return current, None, current["seq"]
    return None, None, await storage.last_run_seq(thread_id)
