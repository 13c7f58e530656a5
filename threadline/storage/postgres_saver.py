"""LangGraph's PostgreSQL checkpointer, with a task's writes serialized on the caller's task.

`AsyncPostgresSaver.aput_writes` hands the serialization of a task's writes to a thread
(`asyncio.to_thread`) before it sends them. A run writes once per task per step, the values are small, and
the hand-off to a thread and back cost 140-500 µs on our 2-core machines (`bench/sqlite_hop.py` measures
the same kind of trip), more than serializing them. The SQL, the rows and the serializer are LangGraph's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver


class InlineWritesPostgresSaver(AsyncPostgresSaver):
    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        # As LangGraph's: writes to its special channels replace, other writes are kept.
        query = (self.UPSERT_CHECKPOINT_WRITES_SQL if all(w[0] in WRITES_IDX_MAP for w in writes)
                 else self.INSERT_CHECKPOINT_WRITES_SQL)
        configurable = config["configurable"]
        params = self._dump_writes(configurable["thread_id"], configurable["checkpoint_ns"],
                                   configurable["checkpoint_id"], task_id, task_path, writes)
        async with self._cursor(pipeline=True) as cur:
            await cur.executemany(query, params)
