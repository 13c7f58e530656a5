"""Crons: runs on a schedule. The service behind `/runs/crons…`, and the scheduler that fires due ticks.

A cron's `next_run_date` is its next tick. Each pass of the scheduler (every `cron_poll_seconds`, in every
process that runs workers) reads the due ticks and, for each, claims it in the database with a conditional
update (`Storage.claim_cron_tick`): of all the processes sharing the database exactly one wins, with no
coordinator. The winner creates the tick's run through `Runs.create` (so a thread cron's run meets the
thread's multitask strategy like any other run), then moves `next_run_date` on to the schedule's first tick
after *now*: a cron that was due many times while no process ran fires once for the missed period.

The run's id is derived from the cron and the tick (`tick_run_id`), so a claimer that died between creating
the run and moving on is not repeated: whoever claims the tick after its claim lapses finds the run and only
moves on. The claim lasts `CLAIM_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from threadline.core.access import Access
from threadline.core.assistants import Assistants
from threadline.core.auth import AuthUser, current_user, reset_current_user, set_current_user
from threadline.core.metrics import Metrics
from threadline.core.runs import Runs
from threadline.errors import InvalidInput, NotFound, ThreadlineError, Unavailable
from threadline.storage.base import Row, SortOrder, Storage
from threadline.storage.records import CronRecord

log = logging.getLogger("threadline.crons")

Clock = Callable[[], datetime]
#: How long a claimed tick is held before another process may take it over (its claimer died).
CLAIM_SECONDS = 30.0
#: Due ticks read per query; a pass goes on while a page comes back full.
DUE_PAGE = 100
#: The namespace of the run ids derived from (cron, tick).
TICK_NAMESPACE = uuid.UUID("6f1c3a52-8d0e-4c37-9a3e-2b1f0c9d7e41")
#: Fields of a cron's payload that make its runs (as a run request names them).
RUN_FIELDS = ("input", "config", "context", "checkpoint_during", "interrupt_before", "interrupt_after", "webhook",
              "multitask_strategy", "stream_mode", "stream_subgraphs", "stream_resumable", "durability")
#: The nicknames cron implementations accept, and the five fields each stands for.
_ALIASES = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
            "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """The one format every cron timestamp is stored in (UTC, microseconds), so SQLite compares them as text."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def tick_run_id(cron_id: str, tick: str) -> str:
    return str(uuid.uuid5(TICK_NAMESPACE, f"{cron_id}@{tick}"))


def zone(name: str | None) -> ZoneInfo:
    """An IANA timezone; None is UTC."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"Invalid timezone: '{name}'. Use IANA timezone format (e.g. 'America/New_York').") \
            from exc


class Schedule:
    """A cron expression in a timezone. Five fields (minute hour day-of-month month day-of-week), or six with
    seconds last, as LangGraph's server reads them; `@hourly`, `@daily`, … stand for their five fields. The
    expression is evaluated in the cron's timezone (UTC when it has none), so `0 9 * * *` in
    `America/New_York` fires at nine there, summer and winter; the next tick comes back in UTC."""

    def __init__(self, expression: str, timezone_name: str | None = None) -> None:
        self.expression = expression
        self.zone = zone(timezone_name)
        fields = _ALIASES.get(expression.strip().lower(), expression).split()
        if len(fields) == 6:  # cronsim takes seconds first
            fields = [fields[5], *fields[:5]]
        self._fields = " ".join(fields)
        try:
            CronSim(self._fields, datetime(2000, 1, 1, tzinfo=self.zone))
        except CronSimError as exc:
            raise InvalidInput(
                f"Invalid cron schedule: '{expression}'. Reason: {exc}. Ensure the schedule uses the standard cron "
                "format (minute hour day_of_month month day_of_week). Example: '*/5 * * * *' for every 5 minutes.",
                schedule=expression) from exc

    def next_after(self, moment: datetime) -> datetime | None:
        """The first tick strictly after `moment`, in UTC (None: the expression never fires again)."""
        local = moment.astimezone(self.zone)
        for tick in CronSim(self._fields, local):
            if tick > local:
                return tick.astimezone(UTC)
        return None


def _moment(value: Any) -> datetime | None:
    """A client's timestamp (UTC when it names no offset)."""
    if value is None:
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _end_time(value: Any) -> str | None:
    moment = _moment(value)
    return iso(moment) if moment else None


def _payload_time(value: Any) -> str | None:
    """As the payload shows it: the instant in UTC, without zero microseconds."""
    moment = _moment(value)
    return moment.astimezone(UTC).isoformat() if moment else None


def _with_cron_id(config: dict[str, Any] | None, cron_id: str) -> dict[str, Any]:
    """The run config with `configurable.cron_id`, as LangGraph's server sets it in a cron's payload."""
    config = dict(config or {})
    config["configurable"] = {**(config.get("configurable") or {}), "cron_id": cron_id}
    return config


class Crons:
    """Cron operations and the scheduler. `clock` is injectable: tests move time instead of waiting for it."""

    def __init__(self, storage: Storage, runs: Runs, assistants: Assistants, metrics: Metrics, *,
                 clock: Clock = utc_now, poll_seconds: float = 1.0, access: Access | None = None) -> None:
        self.storage = storage
        self.access = access or Access()  # `@auth.on.crons…`: filters on the cron's metadata
        self.runs = runs
        self.assistants = assistants
        self.metrics = metrics
        self.clock = clock
        self.poll_seconds = poll_seconds
        self._pass = asyncio.Lock()  # one pass at a time in this process (the loop's, or a caller's)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    # --- the API's operations ------------------------------------------------------
    async def create(self, thread_id: str | None, body: dict[str, Any], *, identity: str | None = None) -> CronRecord:
        """A cron on a thread (its runs run there), or stateless (`thread_id=None`: a new thread per run,
        deleted after the run unless `on_run_completed` is `keep`). `body` is the request, fields unset left out.
        A thread cron needs the caller to see the thread (`threads.read`), as its runs will run there.
        `identity`: who its runs count against (the creator: quotas)."""
        cron_id = str(uuid.uuid4())
        caller = current_user()  # the cron's runs run as whoever created it
        if self.access.enabled:  # `@auth.on.crons.create`, given what LangGraph's server gives it
            metadata = dict(body.get("metadata") or {})
            value = {"payload": {**body, "metadata": metadata}, "schedule": body["schedule"], "cron_id": cron_id,
                     "thread_id": thread_id, "user_id": caller.identity if caller else None,
                     "end_time": body.get("end_time"), "metadata": metadata}
            await self.access.filters("crons", "create", value)
            if value["metadata"]:  # as the handler left it (a stamp), in the cron's metadata and its payload's
                body = {**body, "metadata": value["metadata"]}
        if thread_id is not None:
            await self.runs.threads.get(thread_id, values=False)
        assistant = await self.assistants.runnable(body["assistant_id"])
        schedule = Schedule(body["schedule"], body.get("timezone"))
        await self._check_webhook(body)
        now = self.clock()
        payload = {**body, "assistant_id": assistant["assistant_id"],
                   "config": _with_cron_id(body.get("config"), cron_id)}
        if "end_time" in payload:
            payload["end_time"] = _payload_time(payload["end_time"])
        tick = schedule.next_after(now)
        row: CronRecord = {
            "cron_id": cron_id, "assistant_id": assistant["assistant_id"], "thread_id": thread_id,
            "user_id": caller.identity if caller else None, "auth_user": dict(caller) if caller else None,
            "schedule": body["schedule"], "timezone": body.get("timezone"), "end_time": _end_time(body.get("end_time")),
            "enabled": body.get("enabled", True),
            "on_run_completed": None if thread_id else body.get("on_run_completed") or "delete",
            "payload": payload, "metadata": body.get("metadata") or {},
            "next_run_date": iso(tick) if tick else None, "created_at": iso(now), "updated_at": iso(now),
            "identity": identity,
        }
        return await self.storage.create_cron(row)

    async def _check_webhook(self, body: dict[str, Any]) -> None:
        """A cron's webhook under the same policy as a run's, when it is given: refused now (422), not at
        each tick, where the refusal would only fail the cron's runs."""
        if body.get("webhook") and self.runs.webhooks is not None:
            await self.runs.webhooks.check(body["webhook"])

    async def get(self, cron_id: str, *, action: str = "read", value: dict[str, Any] | None = None) -> CronRecord:
        """The cron, if the caller may `action` it; otherwise, as when there is none, `NotFound`."""
        filters = await self.access.filters("crons", action, value or {"cron_id": cron_id})
        found = await self.storage.get_cron(cron_id, filters=filters)
        if found is None:
            raise NotFound(f"Cron '{cron_id}' not found")
        return found

    async def update(self, cron_id: str, patch: dict[str, Any]) -> CronRecord:
        """Apply a PATCH: `patch` holds the fields sent (`end_time` may be None: no end). As LangGraph's server,
        `metadata` is merged into the cron's and replaces the payload's; the payload takes every field sent.
        A new schedule or timezone, or enabling a disabled cron, moves `next_run_date` to the next tick from now."""
        if "schedule" in patch:
            Schedule(patch["schedule"], patch.get("timezone"))  # 422 before anything is read
        if "timezone" in patch:
            zone(patch["timezone"])
        await self._check_webhook(patch)
        if self.access.enabled:  # the cron through the caller's filter first (the update itself is by id)
            value = {**patch, "cron_id": cron_id}
            await self.get(cron_id, action="update", value=value)
            if "metadata" in value:  # as the handler left it
                patch = {**patch, "metadata": value["metadata"]}
        now = self.clock()

        def change(row: CronRecord) -> Row:
            payload = {**row["payload"], **patch}
            if "end_time" in patch:
                payload["end_time"] = _payload_time(patch["end_time"])
            payload["config"] = _with_cron_id(payload.get("config"), cron_id)
            columns: Row = {"payload": payload, "updated_at": iso(now)}
            for key in ("schedule", "timezone", "enabled", "on_run_completed"):
                if key in patch:
                    columns[key] = patch[key]
            if "end_time" in patch:
                columns["end_time"] = _end_time(patch["end_time"])
            if "metadata" in patch:
                columns["metadata"] = {**row["metadata"], **(patch["metadata"] or {})}
            if "schedule" in patch or "timezone" in patch or (patch.get("enabled") and not row["enabled"]):
                tick = Schedule(str(columns.get("schedule", row["schedule"])),
                                columns.get("timezone", row["timezone"])).next_after(now)
                columns["next_run_date"] = iso(tick) if tick else None
            return columns

        updated = await self.storage.update_cron(cron_id, change)
        if updated is None:
            raise NotFound(f"Cron '{cron_id}' not found")
        return updated

    async def delete(self, cron_id: str) -> None:
        if self.access.enabled:  # the cron through the caller's filter first (the delete itself is by id)
            await self.get(cron_id, action="delete")
        if not await self.storage.delete_cron(cron_id):
            raise NotFound(f"Cron '{cron_id}' not found")

    async def search(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                     enabled: bool | None = None, metadata: dict[str, Any] | None = None, limit: int = 10,
                     offset: int = 0, sort_by: str | None = None,
                     sort_order: SortOrder | None = None) -> list[CronRecord]:
        filters = await self.access.filters("crons", "search", {
            "assistant_id": assistant_id, "thread_id": thread_id, "limit": limit, "offset": offset})
        return await self.storage.search_crons(assistant_id=assistant_id, thread_id=thread_id, enabled=enabled,
                                               metadata=metadata, limit=limit, offset=offset, sort_by=sort_by,
                                               sort_order=sort_order, filters=filters)

    async def count(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                    enabled: bool | None = None, metadata: dict[str, Any] | None = None) -> int:
        filters = await self.access.filters("crons", "search", {"assistant_id": assistant_id, "thread_id": thread_id})
        return await self.storage.count_crons(assistant_id=assistant_id, thread_id=thread_id, enabled=enabled,
                                              metadata=metadata, filters=filters)

    # --- the scheduler ---------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._stopping = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name="threadline-crons")

    async def stop(self, timeout: float = 5.0) -> None:
        """End the loop once its pass in progress is done (a pass is short), cancelling it after `timeout`.
        Not cancelled mid-pass first: a database statement cancelled under a closing pool held shutdown up."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.run_due()
            except Exception:  # a database hiccup must not end the scheduler; the next pass retries
                log.exception("cron scheduler pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.poll_seconds)

    async def run_due(self) -> int:
        """One pass: fire every tick due by `clock()` that this process claims. Returns the runs it created."""
        async with self._pass:
            created = 0
            while True:
                now = self.clock()
                due = await self.storage.due_crons(iso(now), DUE_PAGE)
                for cron in due:
                    created += await self._tick(cron, now)
                if len(due) < DUE_PAGE:
                    return created

    async def _tick(self, cron: CronRecord, now: datetime) -> int:
        cron_id, tick = cron["cron_id"], cron["next_run_date"]
        if tick is None:  # never: `due_crons` gives only crons with a tick due
            return 0
        if not await self.storage.claim_cron_tick(cron_id, tick, now=iso(now),
                                                  until=iso(now + timedelta(seconds=CLAIM_SECONDS))):
            return 0  # another process has it
        created = 0
        try:
            created = await self._fire(cron, tick)
        except Unavailable:
            await self.storage.release_cron_tick(cron_id, tick)  # the next pass tries this tick again
            raise
        except ThreadlineError as exc:  # the tick is refused (a busy thread with `reject`, its assistant gone)
            log.warning("cron %s: its run at %s was not created: %s", cron_id, tick, exc.message)
        except Exception:
            await self.storage.release_cron_tick(cron_id, tick)
            raise
        following = Schedule(cron["schedule"], cron["timezone"]).next_after(now)
        await self.storage.advance_cron(cron_id, tick, iso(following) if following else None)
        return created

    async def _fire(self, cron: CronRecord, tick: str) -> int:
        """Create the tick's run, unless a claimer before us did (and died before moving the cron on)."""
        run_id = tick_run_id(cron["cron_id"], tick)
        if await self.storage.get_run(run_id, output=False) is not None:
            return 0
        payload = cron["payload"]
        body = {k: payload[k] for k in RUN_FIELDS if payload.get(k) is not None}
        # The cron's id in the run's metadata and (as LangGraph's server) in its config's `configurable`.
        body.update(assistant_id=cron["assistant_id"], config=_with_cron_id(body.get("config"), cron["cron_id"]),
                    metadata={**(payload.get("metadata") or {}), "cron_id": cron["cron_id"]})
        if cron["thread_id"] is None:
            body["on_completion"] = cron["on_run_completed"] or "delete"
        # As the caller who created the cron (`Runs.create` stores the current user with the run), counted
        # against the creator's cap on active runs.
        auth_user = cron["auth_user"]
        token = set_current_user(AuthUser(auth_user) if auth_user else None)
        try:
            await self.runs.create(cron["thread_id"], body, run_id=run_id, identity=cron.get("identity"))
        except Exception:
            # A claim that lapsed under a slow pass (`CLAIM_SECONDS`): another claimer took the tick and made its
            # run meanwhile, and ours found the id taken. The tick is done; anything else is this create's error.
            if await self.storage.get_run(run_id, output=False) is not None:
                log.warning("cron %s: its run at %s was made by another scheduler meanwhile", cron["cron_id"], tick)
                return 0
            raise
        finally:
            reset_current_user(token)
        self.metrics.cron_run_created("thread" if cron["thread_id"] else "stateless")
        return 1
