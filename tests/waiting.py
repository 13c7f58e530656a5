"""A bounded wait on a condition, for the tests: the one place a test polls."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any


async def wait_until(condition: Callable[[], Any | Awaitable[Any]], timeout: float = 30.0, every: float = 0.01) -> Any:
    """Check `condition` (a function, sync or async) every `every` seconds until it is truthy; its value.

    Raises TimeoutError after `timeout` seconds. The conditions polled here (a list an agent appends to in
    this process, a run's status read over HTTP) have no event to wait on, so a poll is the wait.
    """
    async with asyncio.timeout(timeout):
        while True:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(every)
