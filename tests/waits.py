"""Bounded waits on a condition: the one way a test waits for something to happen.

A loop that polls with no bound but the test's timeout (120 s) hangs the run for two minutes when the thing
never happens, and then reports the timeout instead of what was awaited. `until` (async) and `until_sync`
poll `condition` until it returns something truthy, and return that; past `timeout` seconds they fail the
test, naming `what` was awaited.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import pytest

T = TypeVar("T")

TIMEOUT = 30.0  # well under pytest-timeout's 120 s: the failure names what never happened


@overload
async def until(condition: Callable[[], Awaitable[T]], *, timeout: float = ..., interval: float = ...,
                what: str = "") -> T: ...
@overload
async def until(condition: Callable[[], T], *, timeout: float = ..., interval: float = ..., what: str = "") -> T: ...
async def until(condition: Callable[[], Any], *, timeout: float = TIMEOUT, interval: float = 0.01,
                what: str = "") -> Any:
    """Poll `condition` (a function or a coroutine function) every `interval` s until it returns a truthy
    value, and return it; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"waited {timeout:g} s for {what or _describe(condition)}; last value: {value!r}")
        await asyncio.sleep(interval)


def until_sync(condition: Callable[[], T], *, timeout: float = TIMEOUT, interval: float = 0.05, what: str = "") -> T:
    """`until` for code outside an event loop (real processes polled over blocking HTTP)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"waited {timeout:g} s for {what or _describe(condition)}; last value: {value!r}")
        time.sleep(interval)


def logged(log: list[str], prefix: str) -> Callable[[], bool]:
    """A condition: an entry of `log` (the test agents' WORK_LOG) starts with `prefix`."""
    return lambda: any(entry.startswith(prefix) for entry in log)


async def agent_stopped(tag: str) -> None:
    """Wait until the test agent doing `tag`'s work (`slow`, `subagent`) was cancelled mid-way: from then on it
    does no more of it (instead of sleeping to see WORK_LOG stand still). Fails the test if it is not."""
    from tests.project.agents import STOPPED

    await until(lambda: tag in STOPPED, what=f"the agent doing {tag!r}'s work to be cancelled")


def _describe(condition: Callable[..., object]) -> str:
    name = getattr(condition, "__qualname__", repr(condition))
    return f"{name} to hold" if name != "<lambda>" else "the condition to hold"
