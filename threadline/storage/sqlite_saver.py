"""LangGraph's SQLite checkpointer on the embedded backend's write connection.

A run writes a checkpoint and each task's writes at every step, and reads the thread's latest checkpoint
when it starts and ends. LangGraph's `AsyncSqliteSaver` makes each of those one or more trips to a
connection thread, on a connection of its own whose write lock our queue's connection then waits for. This
saver uses the storage's `Writer` instead (see `sqlite_writer.py`): each write is one short transaction
run on the event loop, and a read of the latest checkpoint runs there too, with LangGraph's own code.
Every write is committed before it returns, except through `grouped()`, the saver of `async` and `exit`
runs, whose writes are committed in groups (`sqlite_writer.py`, "Group commit").

The tables and rows are LangGraph's `SqliteSaver`'s, but for one: a channel value that serializes to
`BLOB_BYTES` or more is stored once per version of its channel, in `checkpoint_blobs` (migration 0014), not
inside each checkpoint that holds it, as LangGraph's PostgreSQL and in-memory savers store every value. Stored
whole, a checkpoint repeats the state's unchanged values at every step: a thread with 1 MB of documents grew
by about 4 MB per run. Reads fill the values back in (`_filled`), so checkpoints written whole before read as
they are. A checkpoint and a task's writes are serialized as LangGraph serializes them, on the caller's task,
so a value that cannot be serialized fails its own run.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP, BaseCheckpointSaver, CheckpointTuple
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
#: A channel value at least this large (serialized) is stored apart, once per version (see the module docstring).
BLOB_BYTES = 4096
#: Threads remembered as holding values apart (`WriterSqliteSaver._large`), the earliest remembered forgotten first.
_LARGE_THREADS = 10_000
#: Values looked up by one statement (x 2 parameters, + 2: far below SQLite's limit on a statement's parameters).
_PAIRS_PER_QUERY = 400
_PUT_BLOB = ("INSERT OR IGNORE INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
             "VALUES (?, ?, ?, ?, ?, ?)")
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
        # The threads (and namespaces) whose latest checkpoint held values apart, shared with the grouped saver:
        # their next checkpoint is split at once, not serialized whole first (`aput`).
        self._large: dict[tuple[str, str], None] = {}

    def grouped(self) -> WriterSqliteSaver:
        """This saver, its checkpoint writes committed in groups (`sqlite_writer.py`, "Group commit"): for runs
        whose durability is `async` or `exit`."""
        if self._grouped is None:
            self._grouped = WriterSqliteSaver(self.writer, group=True, serde=self.serde)
            self._grouped.is_setup = True
            self._grouped._large = self._large
        return self._grouped

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        configurable = config["configurable"]
        thread_id, checkpoint_ns = str(configurable["thread_id"]), configurable["checkpoint_ns"]
        # JSON text, as LangGraph's `SqliteSaver` stores it; a lone surrogate is dropped, as it drops it.
        meta = dumps(checkpoint_metadata(config, metadata)).encode("utf-8", "ignore")
        key = (thread_id, checkpoint_ns)
        row: tuple[Any, ...] = (thread_id, checkpoint_ns, checkpoint["id"], configurable.get("checkpoint_id"),
                                None, None, meta)
        if key not in self._large:
            # A small state is serialized once, whole; a state that turns out large is split after.
            row = (*row[:4], *self.serde.dumps_typed(checkpoint), meta)
        if row[5] is not None and len(row[5]) < BLOB_BYTES:  # no value in it is that large: stored whole
            await self.writer.run(_insert, _PUT_CHECKPOINT, [row], group=self._group)
        # Split. A thread whose last checkpoint held values apart comes here at once: serialized whole first,
        # each of its large values was serialized once more at every checkpoint, changed or not (a long
        # conversation's messages: about 5 times a turn instead of 2).
        elif await self.writer.run(in_transaction, _put_apart, self.serde, row, checkpoint, group=self._group):
            self._large[key] = None
            while len(self._large) > _LARGE_THREADS:
                del self._large[next(iter(self._large))]
        else:
            self._large.pop(key, None)
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

    async def aget_delta_channel_history(self, *, config: Any, channels: Any) -> Any:
        # LangGraph's SQLite fast path reads the checkpoint rows itself, which no longer hold the large values:
        # the generic walk over `aget_tuple` (filled) instead.
        return await BaseCheckpointSaver.aget_delta_channel_history(self, config=config, channels=channels)

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


def keep_latest_checkpoints(db: sqlite3.Connection, serde: SerializerProtocol, thread_id: str) -> None:
    """The thread's latest checkpoint of each namespace, its writes and the values it holds apart; the rest goes."""
    keep = "SELECT checkpoint_ns, MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ? GROUP BY checkpoint_ns"
    for table in ("writes", "checkpoints"):
        db.execute(f"DELETE FROM {table} WHERE thread_id = ? AND (checkpoint_ns, checkpoint_id) NOT IN ({keep})",
                   (thread_id, thread_id))
    _forget_unused_values(db, serde, thread_id)


def delete_run_checkpoints(db: sqlite3.Connection, serde: SerializerProtocol, thread_id: str, run_id: str) -> None:
    """A run's checkpoints and their writes (a rollback: found by their metadata), and the values only they held
    apart; the thread's other checkpoints keep theirs."""
    for sql in SQLITE.statements("delete_run_checkpoints"):
        db.execute(sql, {"thread_id": thread_id, "run_id": run_id})
    _forget_unused_values(db, serde, thread_id)


def _forget_unused_values(db: sqlite3.Connection, serde: SerializerProtocol, thread_id: str) -> None:
    """The values the thread holds apart that none of its checkpoints names any more go."""
    held = db.execute("SELECT rowid, checkpoint_ns, channel, version FROM checkpoint_blobs WHERE thread_id = ?",
                      (thread_id,)).fetchall()
    if not held:
        return
    used: set[tuple[str, str, str]] = set()
    for ns, type_, blob in db.execute("SELECT checkpoint_ns, type, checkpoint FROM checkpoints WHERE thread_id = ?",
                                      (thread_id,)):
        versions = serde.loads_typed((type_, blob)).get("channel_versions") or {}
        used.update((ns, channel, str(version)) for channel, version in versions.items())
    gone = [(rowid,) for rowid, ns, channel, version in held if (ns, channel, version) not in used]
    db.executemany("DELETE FROM checkpoint_blobs WHERE rowid = ?", gone)


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


def _put_apart(db: sqlite3.Connection, serde: SerializerProtocol, row: tuple[Any, ...], checkpoint: Any) -> bool:
    """A checkpoint of `BLOB_BYTES` or more, or of a thread whose last one held values apart (`row`: serialized
    whole, or its type and blob None), in the caller's transaction. A value already stored at its version (one no
    step changed since an earlier checkpoint) stays where it is, neither serialized nor written again; another
    value of `BLOB_BYTES` or more is stored apart; the rest stays inline, and the row is serialized (again)
    without what went apart. A checkpoint written whole before this layout holds nothing apart yet: its next one
    stores its large values. True when the checkpoint holds some value apart."""
    thread_id, checkpoint_ns = row[0], row[1]
    versions = {channel: str(version) for channel, version in (checkpoint.get("channel_versions") or {}).items()}
    values = checkpoint.get("channel_values") or {}
    stored = {(channel, version) for channel, version, *_ in _blob_rows(
        db, "channel, version", (thread_id, checkpoint_ns), [(c, versions[c]) for c in values if c in versions])}
    inline: dict[str, Any] = {}
    blobs: list[tuple[Any, ...]] = []
    for channel, value in values.items():
        version = versions.get(channel)
        if version is not None and (channel, version) in stored:
            continue
        if version is not None:
            value_type, data = serde.dumps_typed(value)
            if len(data) >= BLOB_BYTES:
                blobs.append((thread_id, checkpoint_ns, channel, version, value_type, data))
                continue
        inline[channel] = value
    if len(inline) < len(values) or row[5] is None:
        row = (*row[:4], *serde.dumps_typed({**checkpoint, "channel_values": inline}), row[6])
    db.executemany(_PUT_BLOB, blobs)
    db.execute(_PUT_CHECKPOINT, row)
    return len(inline) < len(values)


def _blob_rows(db: sqlite3.Connection, columns: str, key: tuple[str, str],
               pairs: list[tuple[str, str]]) -> list[Any]:
    """`columns` of the values a thread's namespace (`key`) holds apart at these (channel, version) pairs."""
    found: list[Any] = []
    for start in range(0, len(pairs), _PAIRS_PER_QUERY):
        chunk = pairs[start:start + _PAIRS_PER_QUERY]
        sql = (f"SELECT {columns} FROM checkpoint_blobs WHERE thread_id = ? AND checkpoint_ns = ? AND "
               "(channel, version) IN (VALUES " + ", ".join(["(?, ?)"] * len(chunk)) + ")")
        found.extend(db.execute(sql, [*key, *(v for pair in chunk for v in pair)]))
    return found


def _list(db: sqlite3.Connection, reader: SqliteSaver, config: Any, kwargs: dict[str, Any]) -> list[CheckpointTuple]:
    return _filled(db, reader.serde, list(reader.list(config, **kwargs)))


def _get_tuple(db: sqlite3.Connection, reader: SqliteSaver, config: Any) -> CheckpointTuple | None:
    found = reader.get_tuple(config)
    return None if found is None else _filled(db, reader.serde, [found])[0]


def _filled(db: sqlite3.Connection, serde: SerializerProtocol, found: list[CheckpointTuple]) -> list[CheckpointTuple]:
    """The checkpoints with the values they hold apart put back: a channel with a version and no value inline
    is looked up at that version (none found: the channel is empty, as in a checkpoint stored whole). One query
    per thread and namespace for every value its checkpoints name (a history shares one row of a value no step
    changed), each decoded for each checkpoint that holds it, as a checkpoint stored whole is."""
    wanted: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for item in found:
        configurable = item.config["configurable"]
        key = (str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", "")))
        values = item.checkpoint["channel_values"]
        wanted.setdefault(key, set()).update((channel, str(version)) for channel, version
                                            in item.checkpoint["channel_versions"].items() if channel not in values)
    stored: dict[tuple[str, str, str, str], tuple[str, bytes]] = {}
    for key, pairs in wanted.items():
        for channel, version, type_, blob in _blob_rows(db, "channel, version, type, blob", key, sorted(pairs)):
            stored[(*key, channel, version)] = (type_, blob)
    if stored:
        for item in found:
            configurable = item.config["configurable"]
            key = (str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", "")))
            values = item.checkpoint["channel_values"]
            for channel, version in item.checkpoint["channel_versions"].items():
                held = None if channel in values else stored.get((*key, channel, str(version)))
                if held is not None:
                    values[channel] = serde.loads_typed(held)
    return found
