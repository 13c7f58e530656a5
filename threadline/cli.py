"""The `threadline` command: `serve` (API and workers), `worker` (workers only), `migrate`."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import signal
import sys
from collections.abc import Coroutine
from dataclasses import fields
from typing import Any, TypeVar

from threadline import __version__
from threadline.errors import ConfigError
from threadline.settings import Settings, redact_url

# Settings that only an HTTP server reads; `worker` and `migrate` do not take them.
_HTTP_ONLY = {"host", "port", "max_body_bytes", "heartbeat_seconds"}
T = TypeVar("T")
_COMMANDS = {
    "serve": ("Start the server: the HTTP API and (unless --workers 0) in-process workers.", None),
    "worker": ("Run workers only: claim and execute runs from a shared PostgreSQL database.", _HTTP_ONLY),
    "migrate": ("Create or upgrade the database schema, then exit.", None),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="threadline", description="Serve LangGraph agents over the Agent Protocol.")
    parser.add_argument("--version", action="version", version=f"threadline {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, skip) in _COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        for f in fields(Settings):
            if name == "migrate" and f.name not in ("config", "database_url", "log_level"):
                continue
            if skip and f.name in skip:
                continue
            kind = type(f.default) if f.default is not None else str
            cmd.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None,
                             help=f"{f.metadata['help']} [env THREADLINE_{f.name.upper()}]")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    settings = Settings.resolve({f.name: getattr(args, f.name, None) for f in fields(Settings)})
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "serve":
            serve(settings)
        elif args.command == "worker":
            run_loop(work(settings))
        else:
            run_loop(migrate(settings))
    except ConfigError as exc:
        print(f"threadline: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def event_loop_name() -> str:
    """The event loop `serve` (uvicorn's "auto"), `worker` and the bench run on: uvloop where installed."""
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on the loop `event_loop_name()` names."""
    if event_loop_name() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def serve(settings: Settings) -> None:
    import uvicorn

    from threadline.api.app import create_app
    from threadline.core.runtime import default_database_url

    app = create_app(settings)
    project = app.state.project
    print(f"Threadline {__version__}")
    print(f"  config:   {project.path}")
    print(f"  agents:   {', '.join(project.graphs)}"
          + (f" (default: {project.default_agent})" if project.default_agent else ""))
    print(f"  data:     {redact_url(settings.database_url or default_database_url())}")
    print(f"  broker:   {redact_url(settings.redis_url) if settings.redis_url else 'in-process'}")
    print(f"  workers:  {settings.workers}")
    prefix = project.http.mount_prefix  # langgraph.json http.mount_prefix: the API (and its docs) under it
    docs = "" if "meta" in project.http.disabled else f"  (docs at {prefix}/docs)"
    print(f"  listening on http://{settings.host}:{settings.port}{prefix}{docs}", flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower())


async def work(settings: Settings) -> None:
    """Workers without an HTTP server, until SIGTERM or SIGINT; then unfinished runs go back to the queue."""
    from threadline.core.runtime import Runtime

    if settings.workers < 1:
        raise ConfigError("threadline worker needs --workers 1 or more")
    if not (settings.database_url or "").startswith(("postgresql:", "postgres:")) or settings.redis_url is None:
        raise ConfigError("a separate worker process needs a shared database and broker: "
                          "--database-url postgresql://… and --redis-url redis://…")
    runtime = await Runtime.open(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runtime.start()
        assert runtime.workers is not None
        print(f"Threadline {__version__} worker {runtime.workers.worker_id}: {settings.workers} slots, "
              f"agents {', '.join(runtime.project.graphs)}", flush=True)
        await stop.wait()
    finally:
        await runtime.close()


async def migrate(settings: Settings) -> None:
    from threadline.core.runtime import default_database_url
    from threadline.storage import open_storage

    url = settings.database_url or default_database_url()
    storage = await open_storage(url)  # opening applies what is missing
    await storage.close()
    print(f"threadline: schema of {redact_url(url)} is up to date", flush=True)

