"""The `Storage` contract over SQL, once for both databases: each method is a named statement (a read) or a
script (a transaction, `scripts.py`), in the backend's `Dialect`.

A backend supplies only its connections: `_transact` steps a script in one transaction, `_read` runs one
read. `heavy` marks work that may touch many rows (SQLite runs it on its connection's thread, off the loop).
"""

from __future__ import annotations

import abc
import functools
import time
from collections.abc import Callable
from typing import Any, Literal, cast

import orjson

from threadline.shapes import FinalRunStatus
from threadline.storage import crons, scripts
from threadline.storage.base import Claim, JsonRead, NewThreadEvent, Quota, Row, RunMetadata, SortOrder, Storage
from threadline.storage.records import (
    AssistantRecord,
    CronRecord,
    NewRun,
    QueueStats,
    RunRecord,
    ThreadEventRecord,
    ThreadRecord,
)
from threadline.storage.rules import seconds_left
from threadline.storage.scripts import Script, T
from threadline.storage.statements import (
    RUN_HEAD,
    THREAD_HEAD,
    THREAD_VALUES_TEXT,
    Dialect,
    like_pattern,
    order_by,
    where,
)

_ASSISTANT_SORT = {"assistant_id", "graph_id", "name", "created_at", "updated_at"}
_THREAD_SORT = {"thread_id", "status", "created_at", "updated_at", "state_updated_at"}


def _thread_columns(values: JsonRead) -> str:
    return THREAD_VALUES_TEXT if values == "text" else "*" if values else THREAD_HEAD


def _as_text(row: Row, column: str = "values") -> Row:
    """A row read with `<column>_text` (`THREAD_VALUES_TEXT`, `get_run_text`): `column` the stored JSON text,
    as an `orjson.Fragment` (`JsonRead`)."""
    text = row.pop(f"{column}_text")
    row[column] = None if text is None else orjson.Fragment(text)
    return row


#: Deadlines remembered from claims (see `SQLStorage._stamped`), at most this many at once.
_STAMPED_KEPT = 10_000


class SQLStorage(Storage):
    """Storage in one SQL database (see the module docstring)."""

    dialect: Dialect
    #: Enqueue in one statement the server runs (`scripts.enqueue_run_at_once`), not the two-step script.
    enqueues_at_once = False

    @functools.cached_property
    def _stamped(self) -> dict[str, tuple[float, float, float]]:
        """Deadlines this process stamped when it claimed a run: run id -> (the seconds stamped, the seconds
        left at the claim on the database's clock, `time.monotonic()` just before the claim). The executor
        asks for the run's deadline as it starts it (`set_run_deadline`): the answer is known, and a start
        then costs no transaction of its own (on SQLite a write through the one writer)."""
        return {}

    def _remember_deadline(self, run: RunRecord | None, seconds: float, since: float, *, fresh: bool = False) -> None:
        """`run` was just claimed with a deadline of `seconds` stamped unless it had one; `fresh`: it had none
        (a run created claimed). Otherwise the seconds left are read from the claimed row (both its
        `updated_at` and its `deadline_at` are on the database's clock)."""
        if run is None or seconds <= 0 or not run.get("deadline_at"):
            return
        if len(self._stamped) >= _STAMPED_KEPT:  # runs claimed here but never started (a crash): forgotten
            self._stamped.clear()
        left = seconds if fresh else seconds_left(run["updated_at"], run["deadline_at"])
        self._stamped[run["run_id"]] = (seconds, left, since)

    @abc.abstractmethod
    async def _transact(self, script: Callable[..., Script[T]], *args: Any, heavy: bool = False,
                        idempotent: bool = False) -> T:
        """Run `script(self.dialect, *args)` as one transaction and return its result (a driver may run it
        again from the start, in a new transaction, after the database refused the first). `idempotent`: the
        script may run again even after it committed (its effect once or twice is the same), so a driver that
        lost its connection under it runs it again once on a fresh one, as it retries reads."""

    @abc.abstractmethod
    async def _read(self, sql: str, params: dict[str, Any], *, point: bool = False) -> list[Row]:
        """One read statement's rows; `point`: a lookup by key."""

    async def _named(self, name: str, *, point: bool = False, **params: Any) -> list[Row]:
        return await self._read(self.dialect.statement(name), params, point=point)

    async def _one(self, name: str, **params: Any) -> Row | None:
        rows = await self._named(name, point=True, **params)
        return rows[0] if rows else None

    # --- assistants ----------------------------------------------------------
    async def create_assistant(self, row: AssistantRecord, *,
                               if_exists: Literal["raise", "do_nothing"]) -> AssistantRecord:
        return await self._transact(scripts.create_assistant, row, if_exists, heavy=True)

    async def ensure_assistants(self, rows: list[AssistantRecord]) -> list[AssistantRecord]:
        return await self._transact(scripts.ensure_assistants, rows, heavy=True)

    async def _get_filtered(self, table: str, key: str, value: str, filters: dict[str, Any],
                            columns: str = "*") -> Row | None:
        """One row by its key, only if it passes an authorization filter (inside the query)."""
        cond, params = where(self.dialect, [(f"{key} = :{key}", {key: value})], filters=filters)
        rows = await self._read(self.dialect.sql(f"SELECT {columns} FROM {table} {cond}"), params, point=True)
        return rows[0] if rows else None

    async def get_assistant(self, assistant_id: str, *,
                            filters: dict[str, Any] | None = None) -> AssistantRecord | None:
        if filters:
            return cast("AssistantRecord | None",
                        await self._get_filtered("assistants", "assistant_id", assistant_id, filters))
        return cast("AssistantRecord | None", await self._one("get_assistant", assistant_id=assistant_id))

    def _assistant_filter(self, graph_id: str | None, name: str | None, metadata: dict[str, Any] | None,
                          filters: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        clauses: list[tuple[str, dict[str, Any]]] = []
        if graph_id is not None:
            clauses.append(("graph_id = :graph_id", {"graph_id": graph_id}))
        if name is not None:
            clauses.append(("{ilike:name:name_like}", {"name_like": like_pattern(name)}))
        return where(self.dialect, clauses, metadata=metadata, filters=filters)

    async def search_assistants(self, *, graph_id: str | None, name: str | None, metadata: dict[str, Any] | None,
                                limit: int, offset: int, sort_by: str, sort_order: SortOrder,
                                filters: dict[str, Any] | None = None) -> list[AssistantRecord]:
        cond, params = self._assistant_filter(graph_id, name, metadata, filters)
        order = order_by(sort_by, sort_order, _ASSISTANT_SORT, "created_at", "assistant_id")
        return cast("list[AssistantRecord]", await self._read(self.dialect.search("assistants", cond, order),
                                                              {**params, "limit": limit, "offset": offset}))

    async def count_assistants(self, *, graph_id: str | None, name: str | None,
                               metadata: dict[str, Any] | None, filters: dict[str, Any] | None = None) -> int:
        cond, params = self._assistant_filter(graph_id, name, metadata, filters)
        rows = await self._read(self.dialect.count("assistants", cond), params)
        return int(rows[0]["n"]) if rows else 0

    async def update_assistant(self, assistant_id: str, changes: Row) -> AssistantRecord:
        return await self._transact(scripts.update_assistant, assistant_id, changes, heavy=True)

    async def delete_assistant(self, assistant_id: str) -> bool:
        return await self._transact(scripts.delete_assistant, assistant_id, heavy=True)

    async def list_assistant_versions(self, assistant_id: str, *, metadata: dict[str, Any] | None, limit: int,
                                      offset: int) -> list[AssistantRecord]:
        cond, params = where(self.dialect, [("assistant_id = :assistant_id", {"assistant_id": assistant_id})],
                             metadata=metadata)
        return cast("list[AssistantRecord]", await self._read(
            self.dialect.search("assistant_versions", cond, '"version" DESC'), {**params, "limit": limit,
                                                                                 "offset": offset}))

    async def set_assistant_version(self, assistant_id: str, version: int) -> AssistantRecord | None:
        return await self._transact(scripts.set_assistant_version, assistant_id, version, heavy=True)

    # --- threads -------------------------------------------------------------
    async def create_thread(self, row: Row, *, if_exists: Literal["raise", "do_nothing"]) -> ThreadRecord:
        return await self._transact(scripts.create_thread, row, if_exists)

    async def get_thread(self, thread_id: str, *, filters: dict[str, Any] | None = None,
                         values: JsonRead = True) -> ThreadRecord | None:
        if filters:
            row = await self._get_filtered("threads", "thread_id", thread_id, filters, _thread_columns(values))
        else:
            row = await self._one("get_thread_text" if values == "text" else "get_thread" if values
                                  else "get_thread_head", thread_id=thread_id)
        return cast("ThreadRecord | None", row if row is None or values != "text" else _as_text(row))

    async def update_thread(self, thread_id: str, changes: Row, *,
                            merge_metadata: dict[str, Any] | None = None) -> ThreadRecord | None:
        return await self._transact(scripts.update_thread, thread_id, changes, merge_metadata)

    async def store_thread_state(self, thread_id: str, fields: Row) -> bool:
        return await self._transact(scripts.store_thread_state, thread_id, fields)

    async def delete_thread(self, thread_id: str) -> bool:
        # With its runs, events and checkpoints, in one transaction.
        return bool(await self._transact(scripts.delete_threads, [thread_id], heavy=True))

    async def delete_expired_threads(self, *, limit: int, now: str | None = None) -> list[str]:
        return await self._transact(scripts.delete_expired_threads, now, limit, heavy=True)

    def _thread_filter(self, ids: list[str] | None, metadata: dict[str, Any] | None, values: dict[str, Any] | None,
                       status: str | None, filters: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        clauses: list[tuple[str, dict[str, Any]]] = []
        if ids:
            clauses.append(("thread_id {in:ids}", {"ids": list(ids)}))
        if status is not None:
            clauses.append(("status = :status", {"status": status}))
        return where(self.dialect, clauses, metadata=metadata, values=values, filters=filters)

    async def search_threads(self, *, ids: list[str] | None, metadata: dict[str, Any] | None,
                             values: dict[str, Any] | None, status: str | None, limit: int, offset: int,
                             sort_by: str, sort_order: SortOrder, filters: dict[str, Any] | None = None,
                             with_values: JsonRead = True) -> list[ThreadRecord]:
        cond, params = self._thread_filter(ids, metadata, values, status, filters)
        order = order_by(sort_by, sort_order, _THREAD_SORT, "created_at", "thread_id")
        statement = self.dialect.search("threads", cond, order, _thread_columns(with_values))
        rows = await self._read(statement, {**params, "limit": limit, "offset": offset})
        return cast("list[ThreadRecord]", [_as_text(r) for r in rows] if with_values == "text" else rows)

    async def count_threads(self, *, metadata: dict[str, Any] | None, values: dict[str, Any] | None,
                            status: str | None, filters: dict[str, Any] | None = None) -> int:
        cond, params = self._thread_filter(None, metadata, values, status, filters)
        rows = await self._read(self.dialect.count("threads", cond), params)
        return int(rows[0]["n"]) if rows else 0

    # --- runs and the queue ----------------------------------------------------
    async def enqueue_run(self, run: NewRun, *, thread_metadata: dict[str, Any], create_thread: bool,
                          reject_if_active: bool, thread_ttl_minutes: float | None = None,
                          new_thread_metadata: dict[str, Any] | None = None,
                          claim_for: Claim | tuple[str, float] | None = None,
                          run_metadata: RunMetadata | None = None,
                          quota: Quota | None = None) -> RunRecord:
        claim = Claim(*claim_for) if claim_for is not None else None
        since = time.monotonic()
        script = scripts.enqueue_run_at_once if self.enqueues_at_once else scripts.enqueue_run
        created = await self._transact(script, run, thread_metadata, create_thread, reject_if_active,
                                       thread_ttl_minutes, new_thread_metadata or {}, claim, run_metadata, quota)
        if claim is not None and created["status"] == "running":
            self._remember_deadline(created, claim.deadline_seconds, since, fresh=True)
        return created

    async def heartbeat_runs(self, worker_id: str, held: dict[str, int], lease_seconds: float) -> set[str]:
        if not held:
            return set()
        return await self._transact(scripts.heartbeat_runs, worker_id, held, lease_seconds)

    async def release_runs(self, worker_id: str, held: dict[str, int]) -> list[str]:
        if not held:
            return []
        return await self._transact(scripts.release_runs, worker_id, held, heavy=True)

    async def finish_run(self, run_id: str, status: FinalRunStatus, *, error: Any = None, output: Any = None,
                         thread_changes: Row | None = None, worker_id: str | None = None,
                         attempt: int | None = None, delete_thread: bool = False) -> RunRecord | None:
        self._stamped.pop(run_id, None)
        return await self._transact(scripts.finish_run, run_id, status, error, output, thread_changes or {},
                                    worker_id, attempt, delete_thread)

    async def cancel_pending_runs(self, run_ids: list[str], status: FinalRunStatus) -> list[str]:
        if not run_ids:
            return []
        return await self._transact(scripts.cancel_pending_runs, run_ids, status, heavy=True)

    async def get_run(self, run_id: str, *, output: JsonRead = True) -> RunRecord | None:
        if output == "text":
            row = await self._one("get_run_text", run_id=run_id)
            return cast("RunRecord | None", row if row is None else _as_text(row, "output"))
        return cast("RunRecord | None", await self._one("get_run" if output else "get_run_head", run_id=run_id))

    async def search_runs(self, *, thread_id: str | None, assistant_id: str | None, status: str | None,
                          metadata: dict[str, Any] | None, limit: int, offset: int,
                          thread_filters: dict[str, Any] | None = None, with_output: bool = True) -> list[RunRecord]:
        given = {"thread_id": thread_id, "assistant_id": assistant_id, "status": status}
        clauses = [(f"{col} = :{col}", {col: val}) for col, val in given.items() if val is not None]
        if thread_filters:  # only runs of threads that pass the filter
            visible, visible_params = where(self.dialect, [], filters=thread_filters)
            clauses.append((f"thread_id IN (SELECT thread_id FROM threads {visible})", visible_params))
        cond, params = where(self.dialect, clauses, metadata=metadata)
        statement = self.dialect.search("runs", cond, "seq DESC", "*" if with_output else RUN_HEAD)
        return cast("list[RunRecord]", await self._read(statement, {**params, "limit": limit, "offset": offset}))

    async def delete_run(self, run_id: str) -> bool:
        return await self._transact(scripts.delete_run, run_id, heavy=True)

    async def active_runs(self, thread_id: str) -> list[RunRecord]:
        return cast("list[RunRecord]", await self._named("active_runs", thread_id=thread_id))

    async def next_run(self, thread_id: str, after_seq: int) -> RunRecord | None:
        rows = await self._named("next_run", thread_id=thread_id, after_seq=after_seq)
        return cast("RunRecord", rows[0]) if rows else None

    async def last_run_seq(self, thread_id: str) -> int:
        rows = await self._named("last_run_seq", thread_id=thread_id)
        return int(rows[0]["seq"] or 0) if rows else 0

    async def recover_runs(self, max_attempts: int, *, expired_only: bool) -> tuple[list[RunRecord], list[RunRecord]]:
        return await self._transact(scripts.recover_runs, max_attempts, expired_only, heavy=True)

    async def sweep_quota_slots(self) -> int:
        return await self._transact(scripts.sweep_quota_slots, idempotent=True)

    async def end_stalled_sessions(self, seconds: float) -> int:
        rows = await self._named("end_stalled_sessions", seconds=seconds)
        return int(rows[0]["n"]) if rows else 0

    async def queue_stats(self) -> QueueStats:
        rows = await self._named("queue_stats")
        row = rows[0] if rows else {}
        return {"pending": int(row.get("pending") or 0), "running": int(row.get("running") or 0),
                "oldest_pending_at": row.get("oldest")}

    # --- limits (issue 16: run deadlines) ---------------------------------------
    async def set_run_deadline(self, run_id: str, seconds: float) -> float:
        stamped = self._stamped.pop(run_id, None)
        if stamped is not None and stamped[0] == seconds:
            return stamped[1] - (time.monotonic() - stamped[2])
        # A claim stamped the worker's default, fresh (the run had no deadline): the run's own replaces it.
        replace = stamped is not None and stamped[1] >= stamped[0] - 0.001
        # Idempotent: a deadline once set is kept (or replaced again, a moment later), and the seconds left
        # are read from it.
        return await self._transact(scripts.set_run_deadline, run_id, seconds, replace, idempotent=True)

    # --- checkpoint helpers ----------------------------------------------------
    async def delete_checkpoints_for_run(self, thread_id: str, run_id: str) -> None:
        # Finds the run's checkpoints by their metadata: many rows.
        await self._transact(scripts.run_named, "delete_run_checkpoints", {"thread_id": thread_id,
                                                                             "run_id": run_id}, heavy=True)

    async def copy_checkpoints(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._transact(scripts.run_named, "copy_checkpoints",
                             {"source": source_thread_id, "target": target_thread_id}, heavy=True)

    # --- protocol events ---------------------------------------------------------
    async def append_thread_events(self, thread_id: str, run_id: str | None,
                                   events: list[NewThreadEvent]) -> list[int]:
        if not events:
            return []
        return await self._transact(scripts.append_thread_events, thread_id, run_id, events)

    async def read_thread_events(self, thread_id: str, *, after: int = 0, limit: int = 500,
                                 run_id: str | None = None, method: str | None = None) -> list[ThreadEventRecord]:
        rows = await self._read(self.dialect.thread_events(run_id is not None, method is not None),
                                {"thread_id": thread_id, "after": after, "limit": limit, "run_id": run_id,
                                 "method": method})
        return cast("list[ThreadEventRecord]", rows)

    async def thread_event_bounds(self, thread_id: str) -> tuple[int, int]:
        rows = await self._named("event_bounds", thread_id=thread_id)
        return (int(rows[0]["lo"] or 0), int(rows[0]["hi"] or 0)) if rows else (0, 0)

    # --- crons (transactions: storage/crons.py; statements: statements.py) ---------------------
    async def create_cron(self, row: CronRecord) -> CronRecord:
        return await self._transact(crons.create_cron, row)

    async def get_cron(self, cron_id: str, *, filters: dict[str, Any] | None = None) -> CronRecord | None:
        if filters:
            found = await self._get_filtered("crons", "cron_id", cron_id, filters)
            return crons.cron_row(found) if found else None
        rows = await self._named("get_cron", point=True, cron_id=cron_id)
        return crons.cron_row(rows[0]) if rows else None

    async def update_cron(self, cron_id: str, change: Callable[[CronRecord], Row]) -> CronRecord | None:
        return await self._transact(crons.update_cron, cron_id, change)

    async def delete_cron(self, cron_id: str) -> bool:
        return await self._transact(crons.one_statement, "delete_cron", {"cron_id": cron_id})

    def _cron_filter(self, assistant_id: str | None, thread_id: str | None, enabled: bool | None,
                     metadata: dict[str, Any] | None, filters: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        clauses: list[tuple[str, dict[str, Any]]] = []
        for column, wanted in (("assistant_id", assistant_id), ("thread_id", thread_id)):
            if wanted is not None:
                clauses.append((f"{column} = :{column}", {column: wanted}))
        if enabled is not None:
            clauses.append(("enabled = :enabled", {"enabled": enabled}))
        return where(self.dialect, clauses, metadata=metadata, filters=filters)

    async def search_crons(self, *, assistant_id: str | None, thread_id: str | None, enabled: bool | None,
                           metadata: dict[str, Any] | None, limit: int, offset: int, sort_by: str | None,
                           sort_order: SortOrder | None,
                           filters: dict[str, Any] | None = None) -> list[CronRecord]:
        cond, params = self._cron_filter(assistant_id, thread_id, enabled, metadata, filters)
        order = order_by(sort_by or "created_at", sort_order or "desc", crons.SORTABLE, "created_at", "cron_id")
        rows = await self._read(self.dialect.search("crons", cond, order), {**params, "limit": limit,
                                                                             "offset": offset})
        return [crons.cron_row(r) for r in rows]

    async def count_crons(self, *, assistant_id: str | None, thread_id: str | None, enabled: bool | None,
                          metadata: dict[str, Any] | None, filters: dict[str, Any] | None = None) -> int:
        cond, params = self._cron_filter(assistant_id, thread_id, enabled, metadata, filters)
        rows = await self._read(self.dialect.count("crons", cond), params)
        return int(rows[0]["n"]) if rows else 0

    async def due_crons(self, now: str, limit: int) -> list[CronRecord]:
        rows = await self._named("due_crons", now_at=now, limit=limit)
        return [crons.cron_row(r) for r in rows]

    async def claim_cron_tick(self, cron_id: str, tick: str, *, now: str, until: str) -> bool:
        return await self._transact(crons.one_statement, "claim_cron_tick",
                                    {"cron_id": cron_id, "tick": tick, "now_at": now, "until": until})

    async def advance_cron(self, cron_id: str, tick: str, next_run_date: str | None) -> bool:
        return await self._transact(crons.one_statement, "advance_cron",
                                    {"cron_id": cron_id, "tick": tick, "next_run_date": next_run_date})

    async def release_cron_tick(self, cron_id: str, tick: str) -> None:
        await self._transact(crons.one_statement, "release_cron_tick", {"cron_id": cron_id, "tick": tick})
