"""A worker's claim on a run, and the fence that keeps a worker that lost it from writing.

The database holds each claim until `lease_expires_at`; the worker extends it by heartbeat. This side
keeps its own, more pessimistic, view: a lease counts as held only until `lease_seconds` after the last
heartbeat was *sent* (the database set its expiry no earlier than that). A process that was paused
(SIGSTOP, a long GC, a blocked event loop) past its lease therefore knows, the moment it runs again, that
it can no longer write, before any heartbeat answers. `attempt` is the fencing token the database checks
when the run ends, so even a write that slipped past this check cannot end someone else's claim.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, cast

from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from threadline.storage.base import checkpoint_metadata
from threadline.tracing import tracer


class LeaseLost(Exception):
    """This worker no longer holds the run: another worker may be running it, so it must write nothing."""


class Lease:
    """One claimed run: its fencing token and how long this process may still act on it."""

    def __init__(self, run_id: str, attempt: int, lease_seconds: float, *, since: float | None = None) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.lease_seconds = lease_seconds
        self.lost = False
        # Set just before the run's result is written: from then on the run leaves the `running` state in
        # the database, so a heartbeat that no longer finds it must not take that as a lost lease.
        self.finishing = False
        # The claim itself was sent just before `since`; its expiry was set after.
        self._valid_until = (since if since is not None else time.monotonic()) + lease_seconds

    def renewed(self, sent_at: float) -> None:
        self._valid_until = max(self._valid_until, sent_at + self.lease_seconds)

    def valid(self) -> bool:
        return not self.lost and time.monotonic() < self._valid_until

    def check(self) -> None:
        if not self.valid():
            self.lost = True
            raise LeaseLost(f"lease on run {self.run_id} (attempt {self.attempt}) is no longer held")


class FencedCheckpointer(BaseCheckpointSaver[Any]):
    """The thread's checkpointer for one run: reads pass through; writes first check the run's lease.

    It also remembers the last checkpoint the run saved at the root of the thread, as long as no task has
    written against it: the thread's latest state, which the executor reads when the run ends, then comes
    from memory instead of a storage read and deserialization. A checkpoint with writes against it (an
    interrupt, a failed task) is read from storage, which holds those writes. `async` durability saves in
    the background, so a write may be put before or after its checkpoint: `_written` keeps the ids written
    against, and either order drops the remembered checkpoint.
    """

    def __init__(self, inner: BaseCheckpointSaver[Any], lease: Lease) -> None:
        self.serde = inner.serde  # already a typed serializer: the base class's check of it costs µs per run
        self.inner = inner
        self.lease = lease
        self._latest: CheckpointTuple | None = None
        self._written: set[str] = set()

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        latest, wanted = self._latest, config["configurable"]
        if (latest is not None and not wanted.get("checkpoint_id") and not wanted.get("checkpoint_ns")
                and str(wanted.get("thread_id")) == latest.config["configurable"]["thread_id"]):
            return latest
        return await self.inner.aget_tuple(config)

    def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
        return self.inner.alist(config, **kwargs)

    async def aput(self, config: Any, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> Any:
        self.lease.check()
        remember = not config["configurable"].get("checkpoint_ns")
        if remember:
            # As storage holds it. LangGraph hands each save a checkpoint of its own, but it may still change
            # the metadata it passed.
            # LangGraph's metadata with `thread_id` added: still a CheckpointMetadata (its keys are all optional).
            metadata = cast(CheckpointMetadata, checkpoint_metadata(config, metadata))
        with tracer().span("threadline.checkpoint.put", {"langgraph.checkpoint_id": checkpoint["id"]}):
            saved = await self.inner.aput(config, checkpoint, metadata, new_versions)
        if remember:
            parent = config["configurable"].get("checkpoint_id")
            self._latest = None if checkpoint["id"] in self._written else CheckpointTuple(
                saved, checkpoint, metadata,
                {"configurable": {**saved["configurable"], "checkpoint_id": parent}} if parent else None, [])
        return saved

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        self.lease.check()
        written = config["configurable"].get("checkpoint_id")
        self._written.add(written)
        if self._latest is not None and self._latest.checkpoint["id"] == written:
            self._latest = None
        with tracer().span("threadline.checkpoint.put_writes", {"langgraph.task_id": task_id}):
            await self.inner.aput_writes(config, writes, task_id, task_path)

    async def aget_delta_channel_history(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.aget_delta_channel_history(*args, **kwargs)

    def get_next_version(self, current: Any, channel: Any) -> Any:
        return self.inner.get_next_version(current, channel)

    # Runs only use the async API; the sync one is refused rather than silently unfenced.
    def get_tuple(self, config: Any) -> CheckpointTuple | None:
        raise NotImplementedError("runs use the async checkpointer API")

    def list(self, config: Any, **kwargs: Any) -> Iterator[CheckpointTuple]:
        raise NotImplementedError("runs use the async checkpointer API")

    def put(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("runs use the async checkpointer API")

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("runs use the async checkpointer API")
