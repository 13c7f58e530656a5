"""LangGraph's PostgreSQL checkpointer, with its serialization on the caller's task.

`AsyncPostgresSaver` hands the (de)serialization of a checkpoint's channel values and of a task's writes to a
thread (`asyncio.to_thread`): in `aput`, `aput_writes`, and when it reads a checkpoint back. A run saves
at every step, the values are small, and the hand-off to a thread and back cost 140-500 µs on our 2-core
machines (`bench/sqlite_hop.py` measures the same kind of trip), more than serializing them.

So the saver's module sees `asyncio` through `_Asyncio`, whose `to_thread` runs the function at once while
`_inline` is set, and hands it to a thread as before otherwise. `InlinePostgresSaver` sets it, for the
call's own task only (a context variable), around LangGraph's own `aput`, `aput_writes`, `aget_tuple` and `alist`:
the SQL, the rows, the serializer and the code are LangGraph's.

With a `BlobCache` (`blob_cache.py`), `aget_tuple` is LangGraph's with one clause more in its query: the blob
rows of the keys the cache holds for the thread are left out, and the held bytes put in their place before
LangGraph's own `_load_checkpoint_tuple` unpacks them; the large blobs it does receive are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar

from langgraph.checkpoint.base import CheckpointTuple, get_checkpoint_id
from langgraph.checkpoint.postgres import aio as langgraph_aio
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.postgres.base import SELECT_SQL

from threadline.storage.base import checkpoint_metadata
from threadline.storage.blob_cache import BlobCache, Held

T = TypeVar("T")

_inline: contextvars.ContextVar[bool] = contextvars.ContextVar("threadline_inline_serialization", default=False)


class _Asyncio:
    """`asyncio`, except that `to_thread` runs the function on the calling task while `_inline` is set."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def to_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if _inline.get():
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)


langgraph_aio.asyncio = _Asyncio()  # type: ignore[assignment]


_BLOBS_JOINED = "            and bl.version = jsonb_each_text.value\n    ) as channel_values"
#: LangGraph's checkpoint query, leaving out the blob rows whose (channel, version) its first two parameters
#: (two text arrays) name. None if LangGraph's query changed shape: then the cache is not used.
SELECT_SKIPPING_SQL: str | None = SELECT_SQL.replace(_BLOBS_JOINED, _BLOBS_JOINED.replace(
    "\n    )", "\n        where (bl.channel, bl.version) not in (select * from unnest(%s::text[], %s::text[]))"
    "\n    )")) if SELECT_SQL.count(_BLOBS_JOINED) == 1 else None


@contextlib.contextmanager
def _serializing_inline() -> Iterator[None]:
    token = _inline.set(True)
    try:
        yield
    finally:
        _inline.reset(token)


class InlinePostgresSaver(AsyncPostgresSaver):
    """See the module docstring. `blob_cache`: the process's cache of large blobs' bytes, or None."""

    blob_cache: BlobCache | None = None

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        with _serializing_inline():
            return await super().aput(config, checkpoint, checkpoint_metadata(config, metadata),  # type: ignore[arg-type]
                                     new_versions)

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        with _serializing_inline():
            await super().aput_writes(config, writes, task_id, task_path)

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        cache = self.blob_cache
        if cache is None or SELECT_SKIPPING_SQL is None or not cache.max_bytes:
            with _serializing_inline():
                return await super().aget_tuple(config)
        # LangGraph's `aget_tuple`, with the query leaving out the blobs held.
        configurable = config["configurable"]
        thread_id, checkpoint_ns = configurable["thread_id"], configurable.get("checkpoint_ns", "")
        held = cache.held(str(thread_id), checkpoint_ns)
        skipped = ([channel for channel, _ in held], [version for _, version in held])
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            args: tuple[Any, ...] = (*skipped, thread_id, checkpoint_ns, checkpoint_id)
            where = "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
        else:
            args = (*skipped, thread_id, checkpoint_ns)
            where = "WHERE thread_id = %s AND checkpoint_ns = %s ORDER BY checkpoint_id DESC LIMIT 1"
        async with self._cursor() as cur:
            await cur.execute(SELECT_SKIPPING_SQL + where, args, binary=True)
            value = await cur.fetchone()
            if value is None:
                return None
            _with_held(cache, value, held)
            if value["checkpoint"]["v"] < 4 and value["parent_checkpoint_id"]:  # as LangGraph's
                await cur.execute(self.SELECT_PENDING_SENDS_SQL, (thread_id, [value["parent_checkpoint_id"]]))
                if sends := await cur.fetchone():
                    if value["channel_values"] is None:
                        value["channel_values"] = []
                    self._migrate_pending_sends(sends["sends"], value["checkpoint"], value["channel_values"])
            with _serializing_inline():
                return await self._load_checkpoint_tuple(value)

    async def adelete_thread(self, thread_id: str) -> None:
        await super().adelete_thread(thread_id)
        if self.blob_cache is not None:
            self.blob_cache.forget_thread(str(thread_id))

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
        # LangGraph's own reads every row before it hands out the first; it then hands each checkpoint's
        # loading to a thread, one trip per checkpoint (a history of 200: 200 hand-offs). Loaded here instead,
        # in one go, and handed out after.
        with _serializing_inline():
            found = [item async for item in super().alist(config, **kwargs)]
        for item in found:
            yield item


def _with_held(cache: BlobCache, value: dict[str, Any], held: Held) -> None:
    """Keep the large blobs of the checkpoint row `value` in `cache`, and put the `held` ones the query left
    out among its blob rows, in the order LangGraph's query gives them (its channel versions' order)."""
    versions: dict[str, str] = value["checkpoint"].get("channel_versions") or {}
    rows: list[list[bytes]] = value["channel_values"] or []
    thread_id, checkpoint_ns = value["thread_id"], value["checkpoint_ns"]
    received = set()
    for channel_b, type_b, blob in rows:
        channel = channel_b.decode()
        received.add(channel)
        if blob is not None and channel in versions:
            cache.add(thread_id, checkpoint_ns, channel, versions[channel], type_b, blob)
    added = [[channel.encode(), type_b, blob] for (channel, version), (type_b, blob) in held.items()
             if versions.get(channel) == version and channel not in received]
    if added:
        order = {channel: i for i, channel in enumerate(versions)}
        rows = sorted([*rows, *added], key=lambda row: order[row[0].decode()])
        value["channel_values"] = rows
