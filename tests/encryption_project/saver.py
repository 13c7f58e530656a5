"""A project's own checkpointer (langgraph.json `checkpointer.path`): LangGraph's in-memory saver, counting
the calls it gets, behind an async context manager as LangGraph's server loads it."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

CALLS: Counter[str] = Counter()
LIFECYCLE: list[str] = []
SAVERS: list[InMemorySaver] = []  # each one made, newest last


class CountingSaver(InMemorySaver):
    async def aput(self, *args: Any, **kwargs: Any) -> Any:
        CALLS["aput"] += 1
        return await super().aput(*args, **kwargs)

    async def aput_writes(self, *args: Any, **kwargs: Any) -> Any:
        CALLS["aput_writes"] += 1
        return await super().aput_writes(*args, **kwargs)

    async def aget_tuple(self, *args: Any, **kwargs: Any) -> Any:
        CALLS["aget_tuple"] += 1
        return await super().aget_tuple(*args, **kwargs)

    async def adelete_thread(self, *args: Any, **kwargs: Any) -> Any:
        CALLS["adelete_thread"] += 1
        return await super().adelete_thread(*args, **kwargs)


@contextlib.asynccontextmanager
async def checkpointer() -> AsyncIterator[CountingSaver]:
    LIFECYCLE.append("enter")
    try:
        saver = CountingSaver()
        SAVERS.append(saver)
        yield saver
    finally:
        LIFECYCLE.append("exit")
