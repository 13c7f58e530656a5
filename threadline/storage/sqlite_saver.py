"""LangGraph's SQLite checkpointer on the embedded backend's write connection.

A run writes a checkpoint and each task's writes at every step, and reads the thread's latest checkpoint
when it starts and ends. LangGraph's `AsyncSqliteSaver` makes each of those one or more trips to a
connection thread, on a connection of its own whose write lock our queue's connection then waits for. This
saver uses the storage's `Writer` instead (see `sqlite_writer.py`): each write is one short transaction
run on the event loop, and a read of the latest checkpoint runs there too, with LangGraph's own code.
Every write is committed before it returns, except through `grouped()`, the saver of `async` and `exit`
runs, whose writes are committed in groups (`sqlite_writer.py`, "Group commit").

The tables and rows are LangGraph's `SqliteSaver`'s. A checkpoint and a task's writes are serialized as
LangGraph serializes them, on the caller's task, so a value that cannot be serialized fails its own run.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP, CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from threadline.storage.base import checkpoint_metadata
from threadline.storage.sql import dumps
from threadline.storage.sqlite_writer import Writer, in_transaction
from threadline.storage.statements import SQLITE

_PUT_CHECKPOINT = (
    "INSERT OR REPLACE INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
    "checkpoint, metadata) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# As LangGraph's saver: writes to its special channels replace, other writes are kept.
_PUT_WRITES = ("INSERT OR {} INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, "
               "channel, type, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")


class WriterSqliteSaver(AsyncSqliteSaver):
    """See the module docstring. LangGraph's other async methods (list, delta history, setup) run as they
    are, on the connection's thread, under the same lock."""

    def __init__(self, writer: Writer, *, group: bool = False, serde: SerializerProtocol | None = None) -> None:
        super().__init__(writer.conn, serde=serde)
        self.writer = writer
        self.lock = writer.lock  # LangGraph's own methods take it
        # LangGraph's sync saver on the same sqlite3 connection, called only under the writer's lock.
        self._reader = SqliteSaver(writer.conn._conn, serde=self.serde)
        self._reader.is_setup = True  # setup() creates the tables
        self._group = group
        self._grouped: WriterSqliteSaver | None = self if group else None

    def grouped(self) -> WriterSqliteSaver:
        """This saver, its checkpoint writes committed in groups (`sqlite_writer.py`, "Group commit"): for runs
        whose durability is `async` or `exit`."""
        if self._grouped is None:
            self._grouped = WriterSqliteSaver(self.writer, group=True, serde=self.serde)
            self._grouped.is_setup = True
        return self._grouped

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        configurable = config["configurable"]
        thread_id, checkpoint_ns = str(configurable["thread_id"]), configurable["checkpoint_ns"]
        type_, blob = self.serde.dumps_typed(checkpoint)
        # JSON text, as LangGraph's `SqliteSaver` stores it; a lone surrogate is dropped, as it drops it.
        meta = dumps(checkpoint_metadata(config, metadata)).encode("utf-8", "ignore")
        row = (thread_id, checkpoint_ns, checkpoint["id"], configurable.get("checkpoint_id"), type_, blob, meta)
        await self.writer.run(_insert, _PUT_CHECKPOINT, [row], group=self._group)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                 "checkpoint_id": checkpoint["id"]}}

    async def aput_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        configurable = config["configurable"]
        key = (str(configurable["thread_id"]), str(configurable["checkpoint_ns"]), str(configurable["checkpoint_id"]))
        rows = [(*key, task_id, task_path, WRITES_IDX_MAP.get(channel, idx), channel, *self.serde.dumps_typed(value))
                for idx, (channel, value) in enumerate(writes)]
        sql = _PUT_WRITES.format("REPLACE" if all(w[0] in WRITES_IDX_MAP for w in writes) else "IGNORE")
        await self.writer.run(_insert, sql, rows, group=self._group)

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        found: CheckpointTuple | None = await self.writer.run(_get_tuple, self._reader, config)
        return found

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
        # LangGraph's sync `list`, read whole in one trip to the connection's thread before the first is
        # handed out: the async one makes a trip per checkpoint and another for its writes (a history of 200
        # checkpoints: 400 hand-offs), and holds the writer's lock, which every write of the process waits
        # for, across them all.
        found: list[CheckpointTuple] = await self.writer.run(_list, self._reader, config, kwargs, inline=False)
        for item in found:
            yield item

    async def adelete_thread(self, thread_id: str) -> None:
        # A thread can hold many checkpoints: deleted on the connection's thread, not on the loop.
        await self.writer.run(in_transaction, delete_thread_checkpoints, str(thread_id), inline=False)


def delete_thread_checkpoints(db: sqlite3.Connection, thread_id: str) -> None:
    for sql in SQLITE.statements("delete_thread_checkpoints"):
        db.execute(sql, {"thread_ids": dumps([thread_id])})


_ROWS_PER_STATEMENT = 500  # x 9 values: far below SQLite's limit on a statement's parameters


def _insert(db: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """One statement, atomic by itself, for up to `_ROWS_PER_STATEMENT` rows (a task's writes: usually a
    few); more go in one transaction."""
    if len(rows) <= _ROWS_PER_STATEMENT:
        values = sql[sql.index("VALUES ") + 7:]
        db.execute(sql + (", " + values) * (len(rows) - 1), [v for row in rows for v in row])
    else:
        in_transaction(db, _insert_many, sql, rows)


def _insert_many(db: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    db.executemany(sql, rows)


def _list(db: sqlite3.Connection, reader: SqliteSaver, config: Any, kwargs: dict[str, Any]) -> list[CheckpointTuple]:
    return list(reader.list(config, **kwargs))


def _get_tuple(db: sqlite3.Connection, reader: SqliteSaver, config: Any) -> CheckpointTuple | None:
    return reader.get_tuple(config)
