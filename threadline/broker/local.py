"""The signals one process keeps for itself, whatever carries them between processes.

Both brokers deliver wake-ups, run-done and cancel signals to this process through one `LocalSignals`:
the memory broker directly, the Redis broker when a message arrives (and at once for its own sends).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

CancelCallback = Callable[[str], Any]


class LocalSignals:
    """Counted wake-ups, run-done events and cancel callbacks of this process."""

    #: Wake-ups are counted, so one enqueued run wakes one idle worker slot, not all of them (each woken slot
    #: opens a write transaction to claim). Capped: extra wake-ups only cost an empty claim.
    max_wakeups = 1024

    def __init__(self) -> None:
        self._wakeups = 0
        self._work = asyncio.Condition()
        self._done: dict[str, asyncio.Event] = {}
        self._cancel: dict[str, list[CancelCallback]] = {}

    # Wake-ups.
    async def wake(self) -> None:
        async with self._work:
            self._wakeups = min(self._wakeups + 1, self.max_wakeups)
            self._work.notify(1)

    async def wait_for_work(self, timeout: float) -> None:
        async with self._work:
            if self._wakeups == 0:
                try:
                    await asyncio.wait_for(self._work.wait_for(lambda: self._wakeups > 0), timeout)
                except TimeoutError:
                    return
            self._wakeups -= 1

    # Run done.
    def listen_done(self, run_id: str) -> Callable[[float | None], Awaitable[bool]]:
        event = self._done.setdefault(run_id, asyncio.Event())

        async def wait(timeout: float | None) -> bool:
            try:
                await asyncio.wait_for(event.wait(), timeout)
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
