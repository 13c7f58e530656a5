"""Workers: claim runs from the durable queue, execute them, and keep their leases alive.

Each process has one pool of `size` slots and one claimer: it claims for every free slot in one statement
(`claim_runs`), then waits for a wake-up from the broker (a run was enqueued somewhere, or one ended here and
its thread's next run may be claimable); polling every `poll_seconds` is the backstop, so a lost wake-up
costs latency, never a stuck run. An idle process therefore costs the database one empty claim a poll, not
one per slot. One heartbeat task extends the leases of every run this pool holds; in a multi-process
deployment a sweeper retries or fails the runs of workers whose leases lapsed.

A run whose client waits for it (`/wait`, `/stream`) and that this process can start at once is claimed in
the transaction that creates it and executed here (`reserve`, `adopt`): no wake-up, no separate claim, and
its waiter is handed the finished run directly (`started_here`). Slots are counted across both ways in, so
the pool never runs more than `size` runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadline.broker.base import Broker
from threadline.core.executor import Executor, StopSignal
from threadline.core.lease import Lease
from threadline.core.metrics import Metrics
from threadline.core.protocol_events import end_without_worker, signal
from threadline.errors import Unavailable
from threadline.heap import AfterRuns
from threadline.storage.base import Claim, Storage
from threadline.storage.records import AssistantRecord, RunRecord
from threadline.tracing import traced_run

log = logging.getLogger("threadline.worker")
#: How long a database session may stay stopped inside a transaction, waiting for its client's next statement,
#: before the lease sweeper ends it (`Storage.end_stalled_sessions`); the server's idle-in-transaction timeout
#: (10 s) ends the other kind. Ours take milliseconds.
STALLED_SESSION_SECONDS = 10.0


class WorkerPool:
    """`size` concurrent run slots in this process."""

    poll_seconds = 1.0
    stop_seconds = 10.0  # how long `stop` waits for cancelled runs to end

    def __init__(self, storage: Storage, broker: Broker, executor: Executor, size: int, *,
                 lease_seconds: float = 30.0, max_attempts: int = 1, sweep: bool = False) -> None:
        self.storage = storage
        self.broker = broker
        self.executor = executor
        self.size = size
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self.sweep = sweep
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._loops: list[asyncio.Task[None]] = []
        # Runs the claimer took, from their claim: a task not yet started is not in `_running`, and a shutdown
        # must still give its run back.
        self._claimed: dict[str, tuple[asyncio.Task[RunRecord | None], Lease]] = {}
        self._running: dict[str, tuple[asyncio.Task[Any], Lease]] = {}
        self._adopted: dict[str, tuple[asyncio.Task[RunRecord | None], Lease]] = {}
        self._reserved = 0  # slots taken for claims in flight, not yet in `_running`
        self._freed = asyncio.Condition()  # notified when a slot frees: a claimer that found them all full goes on
        self._stopping = False
        self._full = False  # the claimer waits for a slot to free
        self._after_runs = AfterRuns()  # long runs' garbage collected once none runs (`heap.py`)

    @property
    def busy(self) -> int:
        return len(self._running)

    @property
    def free(self) -> int:
        """Slots neither running a run nor reserved for a claim in flight."""
        return self.size - len(self._running) - self._reserved

    def reserve(self) -> bool:
        """Take a free slot for a claim about to be made; `unreserve` it if the claim finds nothing."""
        if not self._loops or self._stopping or self.free <= 0:
            return False
        self._reserved += 1
        return True

    async def unreserve(self) -> None:
        self._reserved -= 1
        await self._slot_freed()

    async def create_here(self, enqueue: Callable[[Claim | None], Awaitable[RunRecord]], *,
                          assistant: AssistantRecord | None = None) -> RunRecord:
        """Create a run through `enqueue`, claimed for a free slot of this pool when there is one (given the
        `Claim` to insert it with; None: no slot is free, it is created pending), and started on that slot
        when storage claimed it (`running`: it could start at once); the run as created."""
        if not self.reserve():
            return await enqueue(None)
        sent = time.monotonic()
        try:
            created = await enqueue(Claim(self.worker_id, self.lease_seconds, self.executor.run_timeout))
        except BaseException:
            await self.unreserve()
            raise
        if created["status"] == "running":
            self.adopt(created, since=sent, assistant=assistant)
        else:
            await self.unreserve()
        return created

    def adopt(self, run: RunRecord, *, since: float, assistant: AssistantRecord | None = None) -> None:
        """Execute on a `reserve`d slot a run claimed for this pool when it was created (`since`: just before;
        `assistant`: its assistant as just read, so the run does not read it again)."""
        lease = Lease(run["run_id"], run["attempt"], self.lease_seconds, since=since)
        task = asyncio.create_task(self._execute(run, lease, assistant), name=f"threadline-run-{run['run_id']}")
        self._adopted[run["run_id"]] = (task, lease)
        task.add_done_callback(lambda _: self._adopted.pop(run["run_id"], None))

    def started_here(self, run_id: str) -> asyncio.Task[RunRecord | None] | None:
        """The execution of an adopted run still in progress: it ends with the finished run, or None when
        this pool did not write its outcome (lease lost, shutdown, rolled back)."""
        found = self._adopted.get(run_id)
        return found[0] if found is not None else None

    async def _slot_freed(self) -> None:
        async with self._freed:
            self._freed.notify_all()

    async def start(self) -> None:
        # LangGraph runs synchronous nodes on the loop's default executor; ours knows which run each is for.
        asyncio.get_running_loop().set_default_executor(self.executor.node_threads)
        self._loops = [asyncio.create_task(self._claimer(), name="threadline-claimer"),
                       asyncio.create_task(self._heartbeat(), name="threadline-heartbeat")]
        if self.sweep:
            self._loops.append(asyncio.create_task(self._sweeper(), name="threadline-sweeper"))
        log.info("worker started: %d slots", self.size, extra={"worker_id": self.worker_id})

    async def stop(self) -> None:
        """Stop claiming; cancel runs in flight and put them back in the queue for another worker."""
        self._stopping = True
        # An adopted or claimed run is held from its creation or claim, before its task has started and joined
        # `_running` (whose tasks are the runs' own, inside theirs).
        outer = [t for t, _ in [*self._adopted.values(), *self._claimed.values()]]
        holding = {**self._adopted, **self._claimed, **self._running}
        log.info("worker stopping: %d run(s) in flight go back to the queue", len(holding),
                 extra={"worker_id": self.worker_id})
        for task in [*self._loops, *outer]:
            task.cancel()
        held = {run_id: lease.attempt for run_id, (_, lease) in holding.items() if lease.valid()}
        for task, _ in list(self._running.values()):
            task.cancel()
        tasks = {*self._loops, *outer, *(t for t, _ in holding.values())}
        # Bounded: a run whose code swallows its cancellation must not hold the shutdown. Its lease is
        # released below all the same, so nothing it writes afterwards is accepted.
        ended, stuck = await asyncio.wait(tasks, timeout=self.stop_seconds) if tasks else (set(), set())
        for task in ended:
            if not task.cancelled() and task.exception() is not None:
                log.warning("a worker task ended with %r while stopping", task.exception())
        if stuck:
            log.warning("%d task(s) did not stop within %.0f s of being cancelled; going on without them",
                        len(stuck), self.stop_seconds)
        if held:
            try:
                released = await self.storage.release_runs(self.worker_id, held)
                log.info("returned %d unfinished run(s) to the queue", len(released))
                for _ in released:  # one wake-up per run, as at enqueue
                    await self.broker.wake_workers()
            except Exception:  # they come back when their leases lapse
                log.exception("could not return runs to the queue at shutdown")
        log.info("worker stopped", extra={"worker_id": self.worker_id})

    async def _claimer(self) -> None:
        while not self._stopping:
            wanted = self.free
            if wanted <= 0:  # every slot holds a run, some of them adopted
                self._full = True
                try:
                    async with self._freed:
                        await self._freed.wait_for(lambda: self._stopping or self.free > 0)
                finally:
                    self._full = False
                continue
            self._reserved += wanted
            try:
                sent = time.monotonic()
                # The runs' deadlines (limits) are stamped by the claim: a start writes nothing of its own.
                runs = await self.storage.claim_runs(self.worker_id, self.lease_seconds, self.executor.run_timeout,
                                                     limit=wanted)
            except Unavailable as exc:  # the database is away: no traceback, it is not our bug
                runs = None
                log.warning("claiming runs failed: %s", exc.message)
            except Exception:
                runs = None
                log.exception("claiming runs failed; retrying")
            if runs is None:
                self._reserved -= wanted
                await asyncio.sleep(self.poll_seconds)
                continue
            self._reserved -= wanted - len(runs)
            for run in runs:
                self._start(run, Lease(run["run_id"], run["attempt"], self.lease_seconds, since=sent))
            if len(runs) < wanted:  # the queue had no more: until a wake-up, or the poll
                await self.broker.wait_for_work(self.poll_seconds)
            # else every free slot was filled and more may be waiting: claim again as soon as one frees

    def _start(self, run: RunRecord, lease: Lease) -> None:
        """Execute a run the claimer took, on one of the slots it reserved."""
        task = asyncio.create_task(self._execute(run, lease, claimed=True), name=f"threadline-run-{run['run_id']}")
        self._claimed[run["run_id"]] = (task, lease)
        task.add_done_callback(lambda _: self._claimed.pop(run["run_id"], None))

    async def _execute(self, run: RunRecord, lease: Lease, assistant: AssistantRecord | None = None, *,
                       claimed: bool = False) -> RunRecord | None:
        """Execute a claimed run on the slot `reserve`d for it; the finished run, or None (see `started_here`).
        `claimed`: by the claimer (not created here), so storage sets this task up for it (`enter_run`)."""
        if claimed:
            self.storage.enter_run(run)
        stop = StopSignal()
        holder: list[asyncio.Task[Any]] = []

        def on_cancel(action: str) -> None:
            if stop.action is None:
                stop.action = action
                if holder and stop.started:  # not started yet: it applies `action` itself when it starts
                    holder[0].cancel()

        # Registered before the task exists: a cancel that arrived since the claim is applied at its start.
        try:
            unregister = await self.broker.on_cancel(run["run_id"], on_cancel)
        except BaseException:
            await self.unreserve()
            raise
        task = asyncio.create_task(self._traced(run, stop, lease, assistant))
        holder.append(task)
        self._running[run["run_id"]] = (task, lease)
        self._reserved -= 1  # the slot is now counted in `_running`
        began = time.monotonic()
        finished: RunRecord | None = None
        try:
            finished = await task
            return finished
        except asyncio.CancelledError:
            if not task.done():
                task.cancel()
            current = asyncio.current_task()
            if not self._stopping and (lease.lost or (current is not None and not current.cancelling())):
                return None  # the run's task was stopped (lease lost, or cancelled early), not this slot: carry on
            raise
        except Exception:
            log.exception("run %s crashed the executor", run["run_id"])
            return None
        finally:
            unregister()
            self._running.pop(run["run_id"], None)
            self._after_runs.run_ended(time.monotonic() - began, len(self._running))  # their garbage, now
            full = self._full  # the claimer waits for a free slot: it claims at once, no wake-up needed
            await asyncio.shield(self._slot_freed())
            # The run's thread may have its next run waiting, and here is a free slot: claim it at once. The
            # run's end says whether it has one (`thread_busy`); a run that did not end so may have.
            next_waits = finished is None or finished.get("thread_busy", True)
            if not self._stopping and not full and next_waits:
                await asyncio.shield(self.broker.wake_here())

    async def _traced(self, run: RunRecord, stop: StopSignal, lease: Lease,
                      assistant: AssistantRecord | None) -> RunRecord | None:
        """The run's execution, in the trace of the request that created it, wherever that was
        (`threadline.tracing`). Its coroutine is made here, inside the task: a task cancelled before its
        first step (shutdown, a lost lease) never runs its coroutine, and one made outside it and handed in
        would be dropped unawaited."""
        result: RunRecord | None = await traced_run(run, self.executor.execute(run, self.worker_id, stop, lease,
                                                                                assistant))
        return result

    async def _heartbeat(self) -> None:
        """Extend every held lease each third of the lease; stop runs whose lease is gone."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            leases = {run_id: lease for run_id, (_, lease) in self._running.items()}
            if not leases:
                continue
            sent = time.monotonic()
            try:
                kept = await self.storage.heartbeat_runs(
                    self.worker_id, {run_id: lease.attempt for run_id, lease in leases.items()}, self.lease_seconds)
            except Unavailable as exc:
                log.warning("heartbeat failed: %s Leases are not extended.", exc.message)
                continue
            except Exception:
                log.exception("heartbeat failed; leases are not extended")
                continue
            for run_id, lease in leases.items():
                if run_id in kept:
                    lease.renewed(sent)
                elif run_id in self._running and not lease.finishing:
                    log.warning("lost the lease on run %s (attempt %d): stopping it, it writes nothing more",
                                run_id, lease.attempt)
                    lease.lost = True
                    self._running[run_id][0].cancel()

    async def _sweeper(self) -> None:
        """Retry or fail runs whose worker stopped heartbeating (it died, or stalled past its lease); give back
        the quota slots of runs no longer active that still hold them (`Storage.sweep_quota_slots`)."""
        while True:
            await asyncio.sleep(self.lease_seconds / 2)
            try:
                await self._end_stalled_sessions()
                await recover(self.storage, self.broker, self.max_attempts, expired_only=True,
                              metrics=self.executor.metrics)
                await self.storage.sweep_quota_slots()
            except Exception:
                log.exception("sweeping expired leases failed")

    async def _end_stalled_sessions(self) -> None:
        """First in a pass: a stalled process's open pipeline holds row locks that the runs taken over from it
        will need. Its failure (the database away, a role that may not end sessions) leaves the pass to go on."""
        try:
            ended = await self.storage.end_stalled_sessions(STALLED_SESSION_SECONDS)
        except Exception as exc:  # noqa: BLE001 - logged; the sweep goes on without it
            log.warning("could not look for stalled database sessions: %s", exc)
            return
        if ended:
            log.warning("ended %d database session(s) stalled inside a transaction for %g s or more",
                        ended, STALLED_SESSION_SECONDS)


async def recover(storage: Storage, broker: Broker, max_attempts: int, *, expired_only: bool,
                  metrics: Metrics | None = None) -> tuple[list[RunRecord], list[RunRecord]]:
    """Take back the runs of workers that are gone: requeue them (and wake a worker), or fail them (and end
    their streams, wake their waiters and tell protocol clients). At start, and in the sweeper. A run whose
    deadline passed meanwhile is not retried: storage ends it `timeout` (counted in `metrics`)."""
    requeued, failed = await storage.recover_runs(max_attempts, expired_only=expired_only)
    for run in requeued:
        log.warning("run %s lost its worker: queued again (attempt %d done)", run["run_id"], run["attempt"])
    for run in failed:
        if run["status"] == "timeout":
            log.warning("run %s lost its worker and its deadline has passed: timeout", run["run_id"])
            if metrics is not None:
                metrics.run_finished("timeout", None)
        else:
            log.warning("run %s lost its worker with no retries left: error", run["run_id"])
        await end_without_worker(storage, broker, run, "failed", run.get("error"))
    for _ in requeued:  # one wake-up per run, as at enqueue; without it a claimer's poll finds the run
        await signal(broker.wake_workers(), "a worker's wake-up")
    return requeued, failed
