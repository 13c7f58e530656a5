"""In-process workers: claim runs from the durable queue and execute them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from typing import Any

from threadline.broker.base import Broker
from threadline.core.executor import Executor, StopSignal
from threadline.storage.base import Storage
from threadline.storage.sql import now_iso

log = logging.getLogger("threadline.worker")


class WorkerPool:
    """`size` concurrent run slots in this process. Wake-ups come from the broker; polling is the backstop."""

    poll_seconds = 1.0

    def __init__(self, storage: Storage, broker: Broker, executor: Executor, size: int) -> None:
        self.storage = storage
        self.broker = broker
        self.executor = executor
        self.size = size
        self.worker_id = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._loops: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._stopping = False

    @property
    def busy(self) -> int:
        return len(self._running)

    async def start(self) -> None:
        self._loops = [asyncio.create_task(self._loop(i), name=f"threadline-worker-{i}") for i in range(self.size)]

    async def stop(self) -> None:
        """Stop claiming; cancel runs in flight (they stay `running` and are recovered on next start)."""
        self._stopping = True
        for task in self._loops:
            task.cancel()
        for task in list(self._running.values()):
            task.cancel()
        for task in [*self._loops, *self._running.values()]:
            with contextlib.suppress(BaseException):
                await task

    async def _loop(self, slot: int) -> None:
        while not self._stopping:
            try:
                run = await self.storage.claim_run(self.worker_id, now_iso())
            except Exception:
                log.exception("claiming a run failed; retrying")
                await asyncio.sleep(self.poll_seconds)
                continue
            if run is None:
                await self.broker.wait_for_work(self.poll_seconds)
                continue
            # There may be more where this came from: pass the wake-up on to another idle slot.
            await self.broker.wake_workers()
            await self._execute(run)
            # Finishing a run may unblock the next one on the same thread for another slot.
            await self.broker.wake_workers()

    async def _execute(self, run: dict[str, Any]) -> None:
        stop = StopSignal()
        holder: list[asyncio.Task[Any]] = []

        def on_cancel(action: str) -> None:
            if stop.action is None:
                stop.action = action
                if holder:
                    holder[0].cancel()

        # Registered before the task exists: a cancel that arrived since the claim is applied at its start.
        unregister = await self.broker.on_cancel(run["run_id"], on_cancel)
        task = asyncio.create_task(self.executor.execute(run, self.worker_id, stop))
        holder.append(task)
        self._running[run["run_id"]] = task
        try:
            await task
        except asyncio.CancelledError:
            if not task.done():
                task.cancel()
            raise
        except Exception:
            log.exception("run %s crashed the executor", run["run_id"])
        finally:
            unregister()
            self._running.pop(run["run_id"], None)
