"""One deployment's live objects, wired together at startup and closed at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from threadline.broker import broker_url, open_broker
from threadline.broker.base import Broker
from threadline.config import CheckpointerTTL, ProjectConfig, find_config, load_config, missing_requirements
from threadline.core.access import Access
from threadline.core.assistants import Assistants
from threadline.core.auth import auth_configured, load_auth
from threadline.core.crons import Crons
from threadline.core.encryption import load_encryption
from threadline.core.executor import Executor
from threadline.core.graphs import GraphRegistry
from threadline.core.metrics import Metrics
from threadline.core.runs import Runs
from threadline.core.threads import Threads
from threadline.core.webhook_policy import WebhookGuard
from threadline.core.webhooks import Webhooks
from threadline.core.worker import WorkerPool, recover
from threadline.loader import load_object, resolve_store_index
from threadline.settings import Settings
from threadline.storage import open_storage
from threadline.storage.base import Storage
from threadline.storage.checkpoint_serde import checkpoint_serializer

log = logging.getLogger("threadline")


def default_database_url(*, create: bool = False) -> str:
    """`./.threadline/threadline.db`. With `create`, the folder is made, holding a `.gitignore` that ignores
    everything in it, so the database never shows up in the project's `git status`."""
    folder = Path.cwd() / ".threadline"
    if create and not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".gitignore").write_text("# Threadline's embedded database (threadline serve); not for git.\n*\n")
    return f"sqlite:///{folder / 'threadline.db'}"


class Draining:
    """Set once, when this process starts to stop: open streams end and tell their clients to reconnect."""

    def __init__(self) -> None:
        self._set = False
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            for callback in list(self._callbacks):
                callback()

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when set; returns the function that stops watching."""
        self._callbacks.append(callback)

        def unwatch() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

        return unwatch


@dataclass
class Runtime:
    settings: Settings
    project: ProjectConfig
    graphs: GraphRegistry
    storage: Storage
    broker: Broker
    assistants: Assistants
    threads: Threads
    runs: Runs
    workers: WorkerPool | None
    started: dict[str, Any] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)
    thread_sweeper: asyncio.Task[None] | None = None
    draining: Draining = field(default_factory=Draining)
    closed: bool = False
    webhooks: Webhooks = field(default_factory=Webhooks)
    crons: Crons | None = None
    access: Access = field(default_factory=Access)

    @classmethod
    def load_project(cls, settings: Settings) -> tuple[ProjectConfig, GraphRegistry]:
        project = load_config(find_config(settings.config))
        for key, value in project.env.items():
            os.environ.setdefault(key, value)
        missing = missing_requirements(project.requirements)
        if missing:  # Threadline runs in the user's environment and installs nothing there (as `langgraph dev`)
            log.warning("langgraph.json dependencies not installed: %s\n  hint: %s -m pip install %s",
                        ", ".join(missing), sys.executable, " ".join(shlex.quote(m) for m in missing))
        return project, GraphRegistry.load(project)

    @classmethod
    async def open(cls, settings: Settings, project: ProjectConfig | None = None,
                   graphs: GraphRegistry | None = None, access: Access | None = None) -> Runtime:
        """`access`: the project's authorization (`@auth.on…` handlers), which every service asks."""
        if project is None or graphs is None:
            project, graphs = cls.load_project(settings)
        if access is None:  # a process without the web layer (`threadline worker`): crons still run as users
            access = Access.of(load_auth(project))
        for key in project.unsupported:
            log.warning("langgraph.json key %r is not supported by Threadline yet and has no effect", key)
        url = settings.database_url or default_database_url(create=True)
        store_index = resolve_store_index(project.store_index, project.root)
        serde = None if project.serde is None else checkpoint_serializer(project.serde.given())
        checkpointer = None if project.checkpointer_path is None else load_object(
            project.checkpointer_path, project.root, what="checkpointer.path")
        storage = await open_storage(url, store_index=store_index, store_ttl=project.store_ttl, serde=serde,
                                     encryption=load_encryption(project), checkpointer=checkpointer,
                                     caps_active_runs=bool(settings.max_active_runs
                                                           or settings.max_active_runs_per_identity),
                                     checkpoint_cache_bytes=settings.checkpoint_cache_bytes,
                                     pool_size=settings.database_pool_size)
        chosen = broker_url(url, settings.redis_url)
        broker = open_broker(chosen, buffer_events=settings.stream_buffer_events,
                             buffer_bytes=settings.stream_buffer_bytes, total_bytes=settings.stream_memory_bytes,
                             key_prefix=settings.redis_key_prefix, outbox_bytes=settings.stream_outbox_bytes,
                             pool_size=settings.database_pool_size, finished_bytes=settings.stream_finished_bytes,
                             coalesce_seconds=settings.stream_coalesce_ms / 1000)
        await broker.start()
        if storage.capabilities.get("multi_process") and chosen is None:
            log.warning("%s is shareable, but without a shared broker stream events, wake-ups and cancels stay "
                        "in this process: run only one process on it", storage.url.split(":", 1)[0])
        assistants = Assistants(storage, graphs, access)
        threads = Threads(storage, graphs, project.checkpointer_ttl, access)
        metrics = Metrics()
        metrics.queue_cap.set(settings.max_active_runs)  # beside num_pending/num_running_runs: depth vs its cap
        guard = WebhookGuard(project.webhooks.url, authenticated=auth_configured(project, settings))
        webhooks = Webhooks(enabled="webhooks" not in project.http.disabled, guard=guard,
                            headers=project.webhooks.headers, fields=project.webhooks.allowed_fields)
        workers = None
        if settings.workers > 0:
            executor = Executor(storage, broker, graphs, threads, metrics, webhooks,
                                run_timeout=settings.run_timeout_seconds,
                                log_coalesce=settings.stream_coalesce_ms / 1000)
            workers = WorkerPool(storage, broker, executor, settings.workers,
                                 lease_seconds=settings.lease_seconds, max_attempts=settings.run_retries,
                                 sweep=bool(storage.capabilities.get("multi_process")))
        runs = Runs(storage, broker, assistants, threads, workers, webhooks=guard,
                    max_per_identity=settings.max_active_runs_per_identity, max_active=settings.max_active_runs,
                    metrics=metrics)
        crons = Crons(storage, runs, assistants, metrics, poll_seconds=settings.cron_poll_seconds, access=access)
        return cls(settings, project, graphs, storage, broker, assistants, threads, runs, workers, metrics=metrics,
                   webhooks=webhooks, crons=crons, access=access)

    async def start(self) -> None:
        await self.assistants.ensure_system_assistants()
        # One process owns an embedded database: whatever it left running died with it. Shared databases
        # have live peers, so only runs whose lease lapsed are taken back (and the sweeper keeps doing so).
        shared = bool(self.storage.capabilities.get("multi_process"))
        requeued, failed = await recover(self.storage, self.broker, self.settings.run_retries,
                                         expired_only=shared, metrics=self.metrics)
        self.started = {"requeued": [r["run_id"] for r in requeued], "failed": [r["run_id"] for r in failed]}
        if self.workers is not None:
            await self.workers.start()
            if self.crons is not None:  # the scheduler runs where runs run; every such process shares the ticks
                self.crons.start()
        # Always on, as LangGraph's server: a thread's own `ttl` (API) expires it without checkpointer.ttl.
        interval = (self.project.checkpointer_ttl or CheckpointerTTL()).sweep_interval_minutes * 60
        self.thread_sweeper = asyncio.create_task(self._sweep_threads(interval), name="threadline-thread-ttl")

    async def _sweep_threads(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                swept = await self.threads.sweep_expired()
            except Exception:  # a database hiccup must not end the sweeper; the next round retries
                log.exception("thread TTL sweep failed")
                continue
            if swept:
                log.info("deleted %d expired threads", len(swept))

    async def close(self) -> None:
        """Stop: open streams end (`draining`), runs in flight go back to the queue, storage closes. Once."""
        if self.closed:
            return
        self.closed = True
        self.draining.set()
        if self.thread_sweeper is not None:
            self.thread_sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.thread_sweeper
        if self.crons is not None:
            await self.crons.stop()
        if self.workers is not None:
            await self.workers.stop()
        await self.webhooks.close()
        await self.broker.close()
        await self.storage.close()
