"""A checkpointer that remembers the checkpoint it last wrote, for a state read that follows a state update.

After `POST /threads/{id}/state`, the thread's row caches the new state's values, interrupts and status
(`Threads.refresh`). Reading them back meant loading the checkpoint the update had just written: on the
1 MB thread of `bench/workloads.py`, the whole checkpoint once more (its blobs fetched and unpacked), about
0.5 ms of CPU on SQLite and 1.6 ms on PostgreSQL per request. `Remembering` wraps the thread's checkpointer
for one request: it passes every call through, keeps the last root checkpoint it put (with the writes put
against it, which are that checkpoint's pending writes), and answers a read of the thread's latest root
checkpoint with that tuple, so that LangGraph's own `aget_state` builds the snapshot from it. Any other read
(a checkpoint by id, a subgraph's namespace, another thread, or before anything was put) goes to the saver.

What is remembered is what LangGraph handed the saver, not the stored bytes read back: the values are the
same objects the serializer wrote. The metadata is LangGraph's, without what a saver adds when it stores it
(the config's keys); only the state's values, tasks and interrupts are read from it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from threadline.storage.saver_wrapper import SaverWrapper


class Remembering(SaverWrapper):
    """See the module docstring. Everything it does not define is the wrapped saver's."""

    def __init__(self, inner: BaseCheckpointSaver[Any]) -> None:
        super().__init__(inner)
        self.latest: CheckpointTuple | None = None

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        written = await self.inner.aput(config, checkpoint, metadata, new_versions)
        configurable = written["configurable"]
        if configurable.get("checkpoint_ns", ""):
            return written  # a subgraph's: the thread's latest root checkpoint is not it
        parent = config["configurable"].get("checkpoint_id")
        parent_config: RunnableConfig | None = (
            {"configurable": {"thread_id": configurable["thread_id"], "checkpoint_ns": "", "checkpoint_id": parent}}
            if parent else None)
        self.latest = CheckpointTuple(written, checkpoint, metadata, parent_config, [])
        return written

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        await self.inner.aput_writes(config, writes, task_id, task_path)
        latest = self.latest
        if latest is not None and _same(config, latest.config):
            assert latest.pending_writes is not None
            latest.pending_writes.extend((task_id, channel, value) for channel, value in writes)

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        latest = self.latest
        configurable = config["configurable"]
        if (latest is not None and not configurable.get("checkpoint_id") and not configurable.get("checkpoint_ns")
                and str(configurable["thread_id"]) == str(latest.config["configurable"]["thread_id"])):
            return latest
        return await self.inner.aget_tuple(config)

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
        async for found in self.inner.alist(config, **kwargs):
            yield found

    async def aget_delta_channel_history(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.aget_delta_channel_history(*args, **kwargs)


def _same(config: Any, other: Any) -> bool:
    a, b = config["configurable"], other["configurable"]
    return (str(a["thread_id"]), a.get("checkpoint_ns", ""), a.get("checkpoint_id")) == (
        str(b["thread_id"]), b.get("checkpoint_ns", ""), b.get("checkpoint_id"))
