"""The `threadline` command."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields

from threadline import __version__
from threadline.errors import ConfigError
from threadline.settings import Settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="threadline", description="Serve LangGraph agents over the Agent Protocol.")
    parser.add_argument("--version", action="version", version=f"threadline {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Start the server (API and in-process workers).")
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        kind = type(f.default) if f.default is not None else str
        serve.add_argument(flag, type=kind, default=None, help=f"{f.metadata['help']} [env THREADLINE_{f.name.upper()}]")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        settings = Settings.resolve({f.name: getattr(args, f.name) for f in fields(Settings)})
        serve(settings)


def serve(settings: Settings) -> None:
    import uvicorn

    from threadline.api.app import create_app
    from threadline.core.runtime import default_database_url

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)
    except ConfigError as exc:
        print(f"threadline: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    rt_project = app.state.project
    print(f"Threadline {__version__}")
    print(f"  config:   {rt_project.path}")
    print(f"  agents:   {', '.join(rt_project.graphs)}"
          + (f" (default: {rt_project.default_agent})" if rt_project.default_agent else ""))
    print(f"  data:     {settings.database_url or default_database_url()}")
    print(f"  workers:  {settings.workers}")
    print(f"  listening on http://{settings.host}:{settings.port}  (docs at /docs)", flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower())
