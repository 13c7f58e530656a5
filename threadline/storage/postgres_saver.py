"""LangGraph's PostgreSQL checkpointer, with its serialization on the caller's task.

`AsyncPostgresSaver` hands the (de)serialization of a checkpoint's channel values and of a task's writes to a
thread (`asyncio.to_thread`): in `aput`, `aput_writes`, and when it reads a checkpoint back. A run saves
at every step, the values are small, and the hand-off to a thread and back cost 140-500 µs on our 2-core
machines (`bench/sqlite_hop.py` measures the same kind of trip), more than serializing them.

So the saver's module sees `asyncio` through `_Asyncio`, whose `to_thread` runs the function at once while
`_inline` is set, and hands it to a thread as before otherwise. `InlinePostgresSaver` sets it, for the
call's own task only (a context variable), around LangGraph's own `aput`, `aput_writes`, `aget_tuple` and `alist`:
the SQL, the rows, the serializer and the code are LangGraph's.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.postgres import aio as langgraph_aio
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from threadline.storage.base import checkpoint_metadata

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


@contextlib.contextmanager
def _serializing_inline() -> Iterator[None]:
    token = _inline.set(True)
    try:
        yield
    finally:
        _inline.reset(token)


class InlinePostgresSaver(AsyncPostgresSaver):
    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        with _serializing_inline():
            return await super().aput(config, checkpoint, checkpoint_metadata(config, metadata),  # type: ignore[arg-type]
                                     new_versions)

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        with _serializing_inline():
            await super().aput_writes(config, writes, task_id, task_path)

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        with _serializing_inline():
            return await super().aget_tuple(config)

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
        # LangGraph's own reads every row before it hands out the first; it then hands each checkpoint's
        # loading to a thread, one trip per checkpoint (a history of 200: 200 hand-offs). Loaded here instead,
        # in one go, and handed out after.
        with _serializing_inline():
            found = [item async for item in super().alist(config, **kwargs)]
        for item in found:
            yield item
