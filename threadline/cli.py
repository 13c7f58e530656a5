"""The `threadline` command: `serve` (API and workers), `dev` (`serve`, restarted when the project's files
change), `worker` (workers only), `migrate`."""

from __future__ import annotations

import argparse
import asyncio
import errno
import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Coroutine
from dataclasses import fields
from typing import Any, TypeVar

from threadline import __version__, logs, tracing
from threadline.errors import ConfigError
from threadline.settings import Settings, redact_url
from threadline.shutdown import GRACE_SECONDS

# Settings that only an HTTP server reads; `worker` and `migrate` do not take them.
_HTTP_ONLY = {"host", "port", "max_body_bytes", "heartbeat_seconds", "ui", "ui_bundler"}
T = TypeVar("T")
_COMMANDS = {
    "serve": ("Start the server: the HTTP API and (unless --workers 0) in-process workers.", None),
    "dev": ("Start a development server that restarts when the project's files change (as `langgraph dev`).", None),
    "worker": ("Run workers only: claim and execute runs from a shared PostgreSQL database.", _HTTP_ONLY),
    "migrate": ("Create or upgrade the database schema, then exit.", None),
}
_MIGRATE = ("config", "database_url", "log_level", "log_format")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="threadline", description="Serve LangGraph agents over the Agent Protocol.")
    parser.add_argument("--version", action="version", version=f"threadline {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, skip) in _COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        if name == "serve":
            cmd.add_argument("--reload", action="store_true", help="Restart when the project's files change "
                             "(the same as `threadline dev`).")
        for f in fields(Settings):
            if (name == "migrate" and f.name not in _MIGRATE) or (skip and f.name in skip) or not f.metadata["flag"]:
                continue  # a setting without a flag (a secret: argv is visible to every user) is env only
            kind: Any = type(f.default) if f.default is not None else str
            if kind is bool:
                cmd.add_argument("--" + f.name.replace("_", "-"), action="store_const", const=True, default=None,
                                 help=f"{f.metadata['help']} [env THREADLINE_{f.name.upper()}]")
                continue
            if f.metadata.get("choices"):
                kind = str.lower  # --log-level DEBUG as well as debug
            default = "" if f.default is None else f" (default: {f.default})"
            # Flags default to None, meaning "not given": the environment and then the default decide.
            cmd.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None,
                             choices=f.metadata.get("choices"),
                             help=f"{f.metadata['help']}{default} [env THREADLINE_{f.name.upper()}]")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    settings = Settings.resolve({f.name: getattr(args, f.name, None) for f in fields(Settings)})
    logs.configure(settings.log_level, settings.log_format)
    if args.command != "migrate":
        tracing.setup(args.command)  # OTEL_* variables; nothing of OpenTelemetry's SDK is imported when off
    try:
        if args.command in ("serve", "dev"):
            serve(settings, reload=args.command == "dev" or args.reload)
        elif args.command == "worker":
            run_loop(work(settings))
        else:
            run_loop(migrate(settings))
    except ConfigError as exc:
        print(f"threadline: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    finally:
        tracing.shutdown()  # the last spans and LangSmith runs are sent before the process exits


def event_loop_name() -> str:
    """The event loop `serve` (uvicorn's "auto"), `worker` and the bench run on: uvloop where installed."""
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to its end on the loop `event_loop_name()` names."""
    if event_loop_name() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def serve(settings: Settings, *, reload: bool = False) -> None:
    """The HTTP server (with `reload`, in a child process restarted when the project's files change)."""
    import uvicorn  # here: `threadline worker` and `migrate` serve no HTTP (and skip its imports)

    from threadline.api.app import create_app
    from threadline.config import find_config
    from threadline.server import Server

    sock = _bind(settings.host, settings.port)
    if reload:
        # The child process builds the app from the environment (`reloading_app`): pass it what was resolved here.
        project = find_config(settings.config)
        os.environ.update({f"THREADLINE_{f.name.upper()}": str(getattr(settings, f.name)) for f in fields(Settings)
                           if getattr(settings, f.name) is not None})
        os.environ["THREADLINE_CONFIG"] = str(project)
        config = uvicorn.Config("threadline.cli:reloading_app", factory=True, reload=True,
                                reload_dirs=[str(project.parent)], reload_includes=["*.py", "langgraph.json", ".env"],
                                host=settings.host, port=settings.port, log_config=None,
                                log_level=settings.log_level.lower(), timeout_graceful_shutdown=GRACE_SECONDS,
                                timeout_keep_alive=settings.keep_alive_seconds,
                                proxy_headers=False)
    else:
        # proxy_headers=False: uvicorn would otherwise take the client's address from X-Forwarded-For whenever
        # the peer is 127.0.0.1 (its forwarded_allow_ips), whatever `trusted_proxies` says; Threadline reads
        # the header itself, from the proxies it is told to trust (`api/ratelimit.py: client_address`).
        config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port, log_config=None,
                                log_level=settings.log_level.lower(), timeout_graceful_shutdown=GRACE_SECONDS,
                                timeout_keep_alive=settings.keep_alive_seconds,
                                proxy_headers=False)
    server = Server(config)
    try:
        if reload:
            from uvicorn.supervisors import ChangeReload

            ChangeReload(config, target=server.run, sockets=[sock]).run()
        else:
            server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    if not reload and not server.started:
        raise SystemExit(1)  # the lifespan said why


def reloading_app() -> Any:
    """`threadline dev`'s app factory, called in each (re)started child process."""
    from threadline.api.app import create_app

    settings = Settings.resolve()
    logs.configure(settings.log_level, settings.log_format)
    tracing.setup("dev")
    try:
        return create_app(settings, watch_ui=True)  # a `ui` component's change is rebundled, as `langgraph dev`
    except ConfigError as exc:  # e.g. a graph that does not import: say so, and wait for the next change
        log = logging.getLogger("threadline")
        log.error("cannot start: %s", exc)
        log.warning("waiting for a file of the project to change, then starting again")
        raise SystemExit(2) from None


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything opens the database: a port in use stops startup at once."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = ("another server is listening there: stop it, or choose another port with --port"
                if exc.errno == errno.EADDRINUSE else "check --host and --port")
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", hint) from exc
    sock.set_inheritable(True)
    return sock


class StartupError(ConfigError):
    """The server cannot start."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(f"{message}\n  hint: {hint}")


async def work(settings: Settings) -> None:
    """Workers without an HTTP server, until SIGTERM or SIGINT; then unfinished runs go back to the queue."""
    from threadline.core.runtime import Runtime
    from threadline.heap import startup_frozen
    from threadline.shutdown import Stop, without_stuck_threads

    if settings.workers < 1:
        raise ConfigError("threadline worker needs --workers 1 or more")
    if not (settings.database_url or "").startswith(("postgresql:", "postgres:")):
        raise ConfigError("a separate worker process needs a shared database: --database-url postgresql://… "
                          "(its broker is that database, or Redis with --redis-url redis://…)")
    runtime = await Runtime.open(settings)
    stop = asyncio.Event()
    # The second signal has nothing left to skip: the first one already stops without waiting.
    with Stop(asyncio.get_running_loop(), graceful=stop.set, now=stop.set).installed():
        try:
            await runtime.start()
            assert runtime.workers is not None
            print(f"Threadline {__version__} worker {runtime.workers.worker_id}: {settings.workers} slots, "
                  f"agents {', '.join(runtime.project.graphs)}", flush=True)
            with startup_frozen():
                await stop.wait()
        finally:
            await runtime.close()
    await without_stuck_threads()


async def migrate(settings: Settings) -> None:
    from threadline.core.runtime import default_database_url
    from threadline.storage import open_storage

    url = settings.database_url or default_database_url(create=True)
    storage = await open_storage(url)  # opening applies what is missing
    await storage.close()
    applied = storage.applied_migrations
    done = f"applied {len(applied)} migration{'s' * (len(applied) != 1)} ({', '.join(applied)})" if applied \
        else "already up to date"
    print(f"threadline: schema of {redact_url(url)}: {done}", flush=True)

