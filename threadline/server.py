"""The HTTP server `threadline serve` and `threadline dev` run: uvicorn's, stopped as `threadline.shutdown` says,
with Threadline's banner. Its own module, imported by `cli.serve` only: `threadline worker` and `migrate` never
import uvicorn (issue 24: RSS at rest)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from threadline import __version__
from threadline.settings import Settings, redact_url
from threadline.shutdown import Stop, without_stuck_threads


class Server(uvicorn.Server):
    """uvicorn's server, stopped by `Stop`'s steps instead of uvicorn's signals, printing Threadline's banner
    once it is listening.

    uvicorn's own handling skips the app's shutdown on a second Ctrl-C, and re-raises the signals it caught
    into asyncio's teardown once it has served; its signals are replaced by ours. The app's runtime is found
    under uvicorn's wrappers (`app.state.runtime`) when the first signal comes, to end open streams. Defined at
    module level: `threadline dev` hands `run` to a child process, which pickles it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        stop = Stop(asyncio.get_running_loop(), graceful=self._graceful, now=self._now)
        with stop.installed():
            yield

    def _graceful(self) -> None:
        self.should_exit = True
        app = self.config.loaded_app
        while app is not None and not hasattr(getattr(app, "state", None), "runtime"):
            app = getattr(app, "app", None)  # under uvicorn's own middleware
        if app is not None:
            app.state.runtime.draining.set()  # open streams end now, with a frame telling them to reconnect

    def _now(self) -> None:
        self.should_exit = self.force_exit = True

    async def shutdown(self, sockets: Any = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:  # uvicorn then skips the app's shutdown: ours returns the runs to the queue
            await self.lifespan.shutdown()

    async def serve(self, sockets: Any = None) -> None:
        await super().serve(sockets)
        await without_stuck_threads()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        app = self.config.loaded_app
        while app is not None and not hasattr(getattr(app, "state", None), "project"):
            app = getattr(app, "app", None)  # under uvicorn's own middleware
        if self.started and app is not None and sockets:
            host, port = sockets[0].getsockname()[:2]
            print(banner(app.state.settings, app.state.project, f"http://{host}:{port}"), flush=True)


def banner(settings: Settings, project: Any, url: str) -> str:
    from threadline.core.runtime import default_database_url

    prefix = project.http.mount_prefix  # langgraph.json http.mount_prefix: the API (and its docs) under it
    return "\n".join([
        f"Threadline {__version__}",
        f"  config:   {project.path}",
        f"  agents:   {', '.join(project.graphs)}"
        + (f" (default: {project.default_agent})" if project.default_agent else ""),
        f"  data:     {redact_url(settings.database_url or default_database_url())}",
        f"  broker:   {_broker_line(settings)}",
        f"  workers:  {settings.workers}",
        f"  listening on {url}{prefix}"
        + ("" if "meta" in project.http.disabled else f"  (docs at {url}{prefix}/docs)"),
    ])


def _broker_line(settings: Settings) -> str:
    from threadline.broker import broker_kind, broker_url

    kind = broker_kind(broker_url(settings.database_url or "", settings.redis_url))
    if kind == "redis":
        return redact_url(settings.redis_url or "")
    return "PostgreSQL (LISTEN/NOTIFY)" if kind == "postgres" else "in-process"
