"""Every setting Threadline reads, declared once.

Precedence: CLI flag > environment variable `THREADLINE_<NAME>` > default.
`docs/configuration.md` documents each one; a test fails when one is missing there.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from typing import Any



def redact_url(url: str) -> str:
    """A database or Redis URL, or a libpq `key=value` string, without its password: for messages and logs."""
    if "://" not in url:
        return re.sub(r"(password\s*=\s*)\S+", r"\1***", url)
    scheme, rest = url.split("://", 1)
    if "@" not in rest:
        return url
    creds, host = rest.rsplit("@", 1)
    return f"{scheme}://{creds.split(':', 1)[0]}@{host}"


def _setting(default: Any, help: str, *, flag: bool = True, choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


@dataclass(frozen=True)
class Settings:
    """Resolved settings for one Threadline process."""

    config: str | None = _setting(
        None, "Path to a langgraph.json. Defaults to ./langgraph.json when it exists, else the bundled example project."
    )
    host: str = _setting("127.0.0.1", "Interface the HTTP server binds to.")
    port: int = _setting(8000, "Port the HTTP server listens on.")
    database_url: str | None = _setting(
        None, "Where durable state lives: sqlite:///path/to/file.db (embedded, one process) or "
        "postgresql://user@host:port/db (scale-out). Defaults to ./.threadline/threadline.db."
    )
    redis_url: str | None = _setting(
        None, "Redis for stream events, wake-ups and cancel signals across processes (redis://host:port/db). "
        "Required with PostgreSQL when more than one process serves; unset means in-process only."
    )
    redis_key_prefix: str = _setting(
        "threadline", "Prefix of every Redis key and channel, so deployments can share one Redis."
    )
    lease_seconds: float = _setting(
        30.0, "How long a worker's claim on a run lasts without a heartbeat (heartbeats every third of it). "
        "A run whose worker stopped heartbeating is retried or failed once its lease expires."
    )
    workers: int = _setting(10, "How many runs this process executes at once (in-process workers). 0 serves the API only.")
    run_retries: int = _setting(
        1, "How many times a run that was running when its process died is retried before it ends as error."
    )
    cron_poll_seconds: float = _setting(
        1.0, "How often each process that runs workers looks for due cron ticks (each tick fires once, whichever "
        "process claims it). A tick fires up to this long after its time."
    )
    max_body_bytes: int = _setting(10 * 1024 * 1024, "Largest request body accepted; larger ones get 413.")
    heartbeat_seconds: float = _setting(
        15.0, "Interval between keep-alive comments on open event streams, and between the newlines a wait for a "
        "run (/runs/wait, .../join) sends while the run goes on."
    )
    stream_buffer_events: int = _setting(
        10_000, "Events kept per run for joins and Last-Event-ID resumption while the process lives."
    )
    ui: str = _setting("on", "The web console at /ui (on), or none (off).", choices=("on", "off"))
    api_keys: str | None = _setting(
        None, "Built-in API keys, for a project without an auth.py: comma-separated 'identity=key' entries. A "
        "request then needs one in x-api-key or Authorization: Bearer. Ignored when langgraph.json has 'auth'.",
        flag=False,
    )
    api_keys_file: str | None = _setting(
        None, "A JSON file of API keys: a list of {\"key\", \"identity\", \"permissions\"?, ...} objects "
        "(added to api_keys).",
    )
    public_paths: str = _setting(
        "", "Comma-separated paths that answer without credentials when authentication is on, among /info, "
        "/metrics, /docs (with its assets) and /openapi.json. /ok always does.",
    )
    allow_unauthenticated: bool = _setting(
        False, "Serve on a non-loopback --host with no authentication configured. Without it, such a server "
        "refuses to start: anyone who reaches the port could run your agents and read every thread.",
    )
    log_level: str = _setting("info", "Log level; debug adds the traceback of a failed startup.",
                              choices=("debug", "info", "warning", "error"))
    log_format: str = _setting("text", "Log lines as text, or as one JSON object per line (json).",
                               choices=("text", "json"))

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def resolve(cls, overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Settings:
        """Merge CLI overrides (None means unset) over `THREADLINE_*` env vars over defaults."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            given = (overrides or {}).get(f.name)
            if given is None:
                raw = env.get(f"THREADLINE_{f.name.upper()}")
                if raw is None:
                    continue
                given = _coerce(raw, type(f.default) if f.default is not None else str, f.name)
            values[f.name] = given
        for f in fields(cls):
            choices = f.metadata.get("choices")
            if choices and f.name in values and str(values[f.name]).lower() not in choices:
                raise SystemExit(f"{f.name} {values[f.name]!r} is not one of {', '.join(choices)}")
        return cls(**values)


def _coerce(raw: str, kind: type, name: str) -> Any:
    try:
        if kind is bool:
            return raw.lower() in ("1", "true", "yes", "on")
        return kind(raw)
    except ValueError as exc:
        raise SystemExit(f"THREADLINE_{name.upper()}={raw!r} is not a valid {kind.__name__}") from exc
