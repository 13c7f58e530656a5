"""`EncryptedStorage`: any `Storage`, with the project's encryption applied to what it stores (`encryption.py`).

It wraps the backend (SQLite or PostgreSQL alike): the JSON fields LangGraph encrypts are sealed before a
row goes down and opened when it comes back (assistants' `config`, `context`, `metadata`; threads'
`metadata`, `values`, `config`, `interrupts`, `error`; runs' `metadata`, `kwargs`, `output`, `error`; crons'
`payload`, `metadata`; Protocol v2's events' `params`), the checkpointer's blobs and metadata
(`EncryptedSaver`) and the store's values (`EncryptedStore`). Everything else passes through to the backend.

Two of the backend's transactions take a function that computes, inside the transaction, from the stored
row (a run's metadata from its thread's; a cron's change): with encryption the row is read and opened
first, the function runs on the plaintext, and the transaction is given the sealed result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, cast

import orjson

from threadline.shapes import FinalRunStatus
from threadline.storage.base import JsonRead, NewThreadEvent, Row, RunMetadata, Storage
from threadline.storage.encryption import CONTEXT_KEY, Codec, stored_context, use_context
from threadline.storage.encryption_savers import EncryptedSaver, EncryptedStore
from threadline.storage.records import (
    AssistantRecord,
    CronRecord,
    NewRun,
    RunRecord,
    ThreadEventRecord,
    ThreadRecord,
)

#: A row of any table (its record, or the columns a write sets).
R = TypeVar("R", bound=Mapping[str, Any])

FIELDS: dict[str, tuple[str, ...]] = {
    "assistant": ("config", "context", "metadata"),
    "thread": ("metadata", "values", "config", "interrupts", "error"),
    "run": ("metadata", "output", "error"),  # and `kwargs`, by `Codec.seal_kwargs`
    "cron": ("payload", "metadata"),
}


class EncryptedStorage:
    """See the module docstring. Not a `Storage` subclass: every method it does not define is the backend's."""

    def __init__(self, inner: Storage, codec: Codec) -> None:
        self.inner = inner
        self.codec = codec
        self.checkpointer = EncryptedSaver(inner.checkpointer, codec)
        self.store = EncryptedStore(inner.store, codec)
        self._run_savers: dict[int, EncryptedSaver] = {}
        self._cron_contexts: dict[str, dict[str, Any]] = {}  # of the crons `due_crons` last gave
        self._run_contexts: dict[str, dict[str, Any]] = {}  # of the runs `claim_runs` gave, until they start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # --- the codec over rows --------------------------------------------------------------------
    async def _seal(self, model: str, row: R) -> R:
        out: Row = {**row}
        for field in FIELDS[model]:
            if field in out:
                out[field] = await self.codec.seal(model, field, out[field])
        if model == "run" and "kwargs" in out:
            out["kwargs"] = await self.codec.seal_kwargs(out["kwargs"])
        return cast("R", out)

    async def _open(self, model: str, row: R | None) -> R | None:
        if row is None:
            return None
        out: Row = {**row}
        for field in FIELDS[model]:
            if field in out:
                out[field] = await self.codec.open(model, field, out[field])
        if model == "run" and "kwargs" in out:
            out["kwargs"] = await self.codec.open_kwargs(out["kwargs"])
        return cast("R", out)

    async def _opened(self, model: str, row: R) -> R:
        """`_open` of a row the backend always returns."""
        opened = await self._open(model, row)
        assert opened is not None
        return opened

    async def _open_all(self, model: str, rows: list[R]) -> list[R]:
        return [r for r in [await self._open(model, row) for row in rows] if r is not None]

    def run_checkpointer(self, durability: str) -> Any:
        inner = self.inner.run_checkpointer(durability)
        if inner is self.inner.checkpointer:
            return self.checkpointer
        if id(inner) not in self._run_savers:
            self._run_savers[id(inner)] = EncryptedSaver(inner, self.codec)
        return self._run_savers[id(inner)]

    # --- assistants -----------------------------------------------------------------------------
    async def create_assistant(self, row: AssistantRecord, *,
                               if_exists: Literal["raise", "do_nothing"]) -> AssistantRecord:
        return await self._opened("assistant", await self.inner.create_assistant(await self._seal("assistant", row),
                                                                                if_exists=if_exists))

    async def ensure_assistants(self, rows: list[AssistantRecord]) -> list[AssistantRecord]:
        sealed = [await self._seal("assistant", row) for row in rows]
        return await self._open_all("assistant", await self.inner.ensure_assistants(sealed))

    async def get_assistant(self, assistant_id: str, *,
                            filters: dict[str, Any] | None = None) -> AssistantRecord | None:
        return await self._open("assistant", await self.inner.get_assistant(assistant_id, filters=filters))

    async def search_assistants(self, **kwargs: Any) -> list[AssistantRecord]:
        return await self._open_all("assistant", await self.inner.search_assistants(**kwargs))

    async def update_assistant(self, assistant_id: str, changes: Row) -> AssistantRecord:
        updated = await self.inner.update_assistant(assistant_id, await self._seal("assistant", changes))
        return await self._opened("assistant", updated)

    async def list_assistant_versions(self, assistant_id: str, **kwargs: Any) -> list[AssistantRecord]:
        return await self._open_all("assistant", await self.inner.list_assistant_versions(assistant_id, **kwargs))

    async def set_assistant_version(self, assistant_id: str, version: int) -> AssistantRecord | None:
        return await self._open("assistant", await self.inner.set_assistant_version(assistant_id, version))

    # --- threads --------------------------------------------------------------------------------
    async def create_thread(self, row: Row, *, if_exists: Literal["raise", "do_nothing"]) -> ThreadRecord:
        created = await self.inner.create_thread(await self._seal("thread", row), if_exists=if_exists)
        return await self._opened("thread", created)

    async def get_thread(self, thread_id: str, *, filters: dict[str, Any] | None = None,
                         values: JsonRead = True) -> ThreadRecord | None:
        # Sealed values are opened, so parsed: "text" reads them as True does.
        return await self._open("thread", await self.inner.get_thread(thread_id, filters=filters,
                                                                      values=bool(values)))

    async def store_thread_state(self, thread_id: str, fields: Row) -> bool:
        return await self.inner.store_thread_state(thread_id, await self._seal("thread", fields))

    async def update_thread(self, thread_id: str, changes: Row, *,
                            merge_metadata: dict[str, Any] | None = None) -> ThreadRecord | None:
        merge = None if merge_metadata is None else await self.codec.seal("thread", "metadata", merge_metadata)
        updated = await self.inner.update_thread(thread_id, await self._seal("thread", changes), merge_metadata=merge)
        return await self._open("thread", updated)

    async def search_threads(self, *, with_values: JsonRead = True, **kwargs: Any) -> list[ThreadRecord]:
        return await self._open_all("thread", await self.inner.search_threads(**kwargs,
                                                                             with_values=bool(with_values)))

    # --- runs -----------------------------------------------------------------------------------
    async def enqueue_run(self, run: NewRun, *, run_metadata: RunMetadata | None = None,
                          new_thread_metadata: Row | None = None, **kwargs: Any) -> RunRecord:
        if run_metadata is not None:
            # The run's metadata is made from its thread's as it is now (None: this run creates the thread) and
            # sealed whole, so the backend stores it as it is given.
            thread = await self.get_thread(run["thread_id"])
            merged = None if thread is None else {**thread["metadata"], **kwargs.get("thread_metadata", {})}
            run = cast("NewRun", {**run, "metadata": run_metadata.made(merged)})
        sealed = await self._seal("run", run)
        new_meta = await self.codec.seal("thread", "metadata", new_thread_metadata or {})
        created = await self.inner.enqueue_run(sealed, run_metadata=None, new_thread_metadata=new_meta, **kwargs)
        return await self._opened("run", created)

    async def claim_runs(self, worker_id: str, lease_seconds: float, deadline_seconds: float = 0.0, *,
                         limit: int = 1) -> list[RunRecord]:
        claimed = await self.inner.claim_runs(worker_id, lease_seconds, deadline_seconds, limit=limit)
        if len(self._run_contexts) > 10_000:  # runs claimed here but never started (a crash): forgotten
            self._run_contexts.clear()
        for run in claimed:  # for `enter_run`, in the task that executes it
            self._run_contexts[run["run_id"]] = stored_context(run.get("kwargs"))
        return await self._open_all("run", claimed)

    def enter_run(self, run: RunRecord) -> None:
        # The run executes in this task: its checkpoints take the context it was stored with.
        found = self._run_contexts.pop(run["run_id"], None)
        if found is not None:
            use_context(found)

    async def finish_run(self, run_id: str, status: FinalRunStatus, *, error: Any = None, output: Any = None,
                         thread_changes: Row | None = None, **kwargs: Any) -> RunRecord | None:
        finished = await self.inner.finish_run(
            run_id, status, error=await self.codec.seal("run", "error", error),
            output=await self.codec.seal("run", "output", output),
            thread_changes=None if thread_changes is None else await self._seal("thread", thread_changes), **kwargs)
        return await self._open("run", finished)

    async def get_run(self, run_id: str, *, output: JsonRead = True) -> RunRecord | None:
        # A sealed output is opened, so parsed: "text" reads it as True does.
        return await self._open("run", await self.inner.get_run(run_id, output=bool(output)))

    async def search_runs(self, **kwargs: Any) -> list[RunRecord]:
        return await self._open_all("run", await self.inner.search_runs(**kwargs))

    async def active_runs(self, thread_id: str) -> list[RunRecord]:
        return await self._open_all("run", await self.inner.active_runs(thread_id))

    async def next_run(self, thread_id: str, after_seq: int) -> RunRecord | None:
        return await self._open("run", await self.inner.next_run(thread_id, after_seq))

    async def recover_runs(self, max_attempts: int, *, expired_only: bool) -> tuple[list[RunRecord], list[RunRecord]]:
        requeued, failed = await self.inner.recover_runs(max_attempts, expired_only=expired_only)
        return await self._open_all("run", requeued), await self._open_all("run", failed)

    # --- protocol events (Threadline's own: LangGraph's server keeps no such log) -----------------------
    async def append_thread_events(self, thread_id: str, run_id: str | None,
                                   events: list[NewThreadEvent]) -> list[int]:
        sealed = [event._replace(params=orjson.dumps(await self.codec.seal(
            "thread_event", "params", orjson.loads(event.params))).decode()) for event in events]
        return await self.inner.append_thread_events(thread_id, run_id, sealed)

    async def read_thread_events(self, thread_id: str, **kwargs: Any) -> list[ThreadEventRecord]:
        rows = await self.inner.read_thread_events(thread_id, **kwargs)
        return [{**row, "params": orjson.dumps(await self.codec.open("thread_event", "params",
                                                                      orjson.loads(row["params"]))).decode()}
                if CONTEXT_KEY in row["params"] else row for row in rows]

    # --- crons ----------------------------------------------------------------------------------
    async def create_cron(self, row: CronRecord) -> CronRecord:
        return await self._opened("cron", await self.inner.create_cron(await self._seal("cron", row)))

    async def get_cron(self, cron_id: str, *, filters: dict[str, Any] | None = None) -> CronRecord | None:
        return await self._open("cron", await self.inner.get_cron(cron_id, filters=filters))

    async def update_cron(self, cron_id: str, change: Callable[[CronRecord], Row]) -> CronRecord | None:
        current = await self.get_cron(cron_id)
        if current is None:
            return None
        columns = await self._seal("cron", change(current))
        return await self._open("cron", await self.inner.update_cron(cron_id, lambda _stored: columns))

    async def search_crons(self, **kwargs: Any) -> list[CronRecord]:
        return await self._open_all("cron", await self.inner.search_crons(**kwargs))

    async def due_crons(self, now: str, limit: int) -> list[CronRecord]:
        due = await self.inner.due_crons(now, limit)
        self._cron_contexts = {row["cron_id"]: stored_context(row.get("payload")) for row in due}
        return await self._open_all("cron", due)

    async def claim_cron_tick(self, cron_id: str, tick: str, *, now: str, until: str) -> bool:
        # The scheduler fires the tick it claims next, on this task: its run is stored with the cron's context.
        use_context(self._cron_contexts.pop(cron_id, {}))
        return await self.inner.claim_cron_tick(cron_id, tick, now=now, until=until)
