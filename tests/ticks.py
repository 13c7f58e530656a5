"""A periodic task's sleep, driven by the test: time passes when the test says so, not on the wall clock.

Code that repeats something every so often takes the function it waits on between rounds (`sleep`, defaulting
to `asyncio.sleep`; `threadline.broker.leases.Leases` does). A test passes `Ticks().sleep` instead and calls
`tick()` for each round it wants: the task's sleep ends at once, and `tick` returns once the round is done and
the task sleeps again, so what the round did can be asserted at once, without waiting out a real interval.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.waits import TIMEOUT


class Ticks:
    """Rounds of one periodic task, each let through by `tick()`."""

    def __init__(self) -> None:
        self.slept = 0  # sleeps the task has begun
        self._allowed = 0  # sleeps the test has ended
        self._changed = asyncio.Condition()

    async def sleep(self, seconds: float) -> None:
        """The task's sleep: returns when the test ticks (`seconds` is the interval it would have waited)."""
        async with self._changed:
            self.slept += 1
            self._changed.notify_all()
            await self._changed.wait_for(lambda: self._allowed >= self.slept)

    async def tick(self, timeout: float = TIMEOUT) -> None:
        """End the task's current sleep and return once its round is done (it sleeps again)."""
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(lambda: self.slept > self._allowed)  # the task is asleep
                self._allowed = self.slept
                self._changed.notify_all()
                await self._changed.wait_for(lambda: self.slept > self._allowed)  # its round done, asleep again
        except TimeoutError:
            pytest.fail(f"waited {timeout:g} s for the periodic task to go round ({self.slept} sleeps begun)")
