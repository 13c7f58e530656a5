"""The typed records (`threadline/storage/records.py`) say what storage really returns, on every backend: each
row read back has every key its record requires, and no key the record does not name. A column added by a
migration and not to its record, or a key a record requires that some read leaves out, fails here (mypy
trusts the records; this test is what keeps them true)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, NotRequired, get_origin, get_type_hints

from tests.test_storage import create_assistant, create_thread, enqueue, later
from threadline.storage import open_storage
from threadline.storage.base import NewThreadEvent, Storage
from threadline.storage.records import (
    AssistantRecord,
    CronRecord,
    QueueStats,
    RunRecord,
    ThreadEventRecord,
    ThreadRecord,
)
from threadline.storage.sql import now_iso


def keys_of(record: Any) -> tuple[set[str], set[str]]:
    """A TypedDict's (required keys, every key). From its evaluated hints: `__required_keys__` does not see a
    `NotRequired` in a postponed (`from __future__ import annotations`) annotation before Python 3.14."""
    hints = get_type_hints(record, include_extras=True)
    optional = {key for key, hint in hints.items() if get_origin(hint) is NotRequired}
    return set(hints) - optional, set(hints)


def check(record: Any, *rows: Mapping[str, Any] | None) -> None:
    required, known = keys_of(record)
    for row in rows:
        assert row is not None
        missing, unknown = required - set(row), set(row) - known
        assert not missing, f"{record.__name__}: a row read back lacks {sorted(missing)}"
        assert not unknown, f"{record.__name__}: a row read back has {sorted(unknown)}, which it does not name"


async def test_every_read_returns_its_record(database_url: str) -> None:
    storage = await open_storage(database_url)
    try:
        await every_read(storage)
    finally:
        await storage.close()


async def every_read(storage: Storage) -> None:
    assistant = await create_assistant(storage, f"a-{uuid.uuid4()}")
    check(AssistantRecord, assistant, await storage.get_assistant(assistant["assistant_id"]),
          await storage.update_assistant(assistant["assistant_id"], {"name": "renamed"}),
          *await storage.list_assistant_versions(assistant["assistant_id"], metadata=None, limit=5, offset=0))

    thread = await create_thread(storage, ttl_minutes=5)
    check(ThreadRecord, thread, await storage.get_thread(thread["thread_id"]),
          await storage.get_thread(thread["thread_id"], values=False),
          await storage.update_thread(thread["thread_id"], {"values": {"n": 1}}, merge_metadata={"k": 1}),
          *await storage.search_threads(ids=[thread["thread_id"]], metadata=None, values=None, status=None,
                                        limit=5, offset=0, sort_by="created_at", sort_order="desc"))

    run = await enqueue(storage, thread["thread_id"], create=False)
    claimed = await storage.claim_run("w", 30)
    assert claimed is not None
    check(RunRecord, run, claimed, await storage.get_run(run["run_id"]),
          *await storage.active_runs(thread["thread_id"]),
          await storage.finish_run(run["run_id"], "success", output={"n": 1}, worker_id="w",
                                   attempt=claimed["attempt"]),
          await enqueue(storage, claim_for=("w", 30)))

    await storage.append_thread_events(thread["thread_id"], run["run_id"],
                                       [NewThreadEvent("lifecycle", "lifecycle", "[]", '{"event": "started"}')])
    check(ThreadEventRecord, *await storage.read_thread_events(thread["thread_id"]))
    check(QueueStats, await storage.queue_stats())

    now = now_iso()
    cron = await storage.create_cron({
        "cron_id": str(uuid.uuid4()), "assistant_id": assistant["assistant_id"], "thread_id": None,
        "user_id": None, "auth_user": {"identity": "u"}, "schedule": "0 0 1 1 *", "timezone": None,
        "end_time": None, "enabled": True, "on_run_completed": "delete", "payload": {"input": 1}, "metadata": {},
        "next_run_date": later(days=30), "created_at": now, "updated_at": now, "identity": None})
    check(CronRecord, cron, await storage.get_cron(cron["cron_id"]),
          await storage.update_cron(cron["cron_id"], lambda _row: {"enabled": False}),
          *await storage.search_crons(assistant_id=assistant["assistant_id"], thread_id=None, enabled=None,
                                      metadata=None, limit=5, offset=0, sort_by=None, sort_order=None))
