"""The signals one process keeps for itself, whatever carries them between processes.

Both brokers deliver wake-ups, run-done and cancel signals to this process through one `LocalSignals`:
the memory broker directly, the Redis broker when a message arrives (and at once for its own sends).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

CancelCallback = Callable[[str], Any]


class LocalSignals:
    """Counted wake-ups, run-done events and cancel callbacks of this process."""

    def __init__(self) -> None:
        # Wake-ups no waiter has taken yet. A process has one waiter, its claimer, which claims for all its
        # free slots at once: the first wait takes them all, and one claim answers every run they announced.
        self._wakeups = 0
        self._idle: deque[asyncio.Future[None]] = deque()  # slots waiting for work, oldest first
        self._done: dict[str, asyncio.Event] = {}
        self._cancel: dict[str, list[CancelCallback]] = {}

    # Wake-ups.
    #
    # No lock and no condition: a condition's wait re-acquires its lock after a cancel, and a slot cancelled
    # twice in a row (a shutdown, or `asyncio.wait_for` around it on Python 3.11) could leave the lock held
    # for ever, so that every later wake-up, and the shutdown itself, waited on it. A wake-up is handed to the
    # oldest idle slot's future, or counted for the next slot that asks.
    async def wake(self) -> None:
        self._hand_over()

    def wake_waiting(self) -> bool:
        """Hand a wake-up to a slot that waits now; False, and nothing counted, when none does."""
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return True
        return False

    def _hand_over(self) -> None:
        if not self.wake_waiting():
            self._wakeups += 1

    async def wait_for_work(self, timeout: float) -> None:
        if self._wakeups > 0:
            self._wakeups = 0
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            pass  # woken at the same instant or not, the slot looks for work now
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._hand_over()  # handed a wake-up, but cancelled before taking it: pass it on
            raise
        finally:
            if not waiter.done() or waiter.cancelled():
                with contextlib.suppress(ValueError):  # not handed a wake-up: no longer idle
                    self._idle.remove(waiter)

    # Run done.
    def listen_done(self, run_id: str) -> Callable[[float | None], Awaitable[bool]]:
        event = self._done.setdefault(run_id, asyncio.Event())

        async def wait(timeout: float | None) -> bool:
            try:
                async with asyncio.timeout(timeout):
                    await event.wait()
                return True
            except TimeoutError:
                return False

        return wait

    def done(self, run_id: str) -> None:
        event = self._done.pop(run_id, None)
        if event is not None:
            event.set()

    def done_all(self) -> None:
        """Wake every waiter (they re-check storage): after signals may have been missed."""
        for run_id in list(self._done):
            self.done(run_id)

    # Cancel.
    def register_cancel(self, run_id: str, callback: CancelCallback) -> Callable[[], None]:
        """Add `callback`; returns the function that removes it."""
        self._cancel.setdefault(run_id, []).append(callback)

        def unregister() -> None:
            callbacks = self._cancel.get(run_id, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._cancel.pop(run_id, None)

        return unregister

    def has_cancel(self, run_id: str) -> bool:
        return bool(self._cancel.get(run_id))

    def cancel_ids(self) -> list[str]:
        return list(self._cancel)

    def cancel(self, run_id: str, action: str) -> bool:
        """Call the run's callbacks here; whether there were any."""
        callbacks = list(self._cancel.get(run_id, []))
        for callback in callbacks:
            callback(action)
        return bool(callbacks)
