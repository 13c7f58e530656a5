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


#: Settings also read from LangGraph's server's environment variable, below our own `THREADLINE_*` one.
ENV_ALIASES = {"run_timeout_seconds": "BG_JOB_TIMEOUT_SECS"}


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
    keep_alive_seconds: int = _setting(
        75, "How long an idle client connection is kept open for its next request. Longer than clients' own "
        "idle expiry (httpx 5 s, aiohttp 15 s) and a load balancer's (60 s on AWS ALB), so the client side "
        "closes first and never sends a request on a connection the server is closing at that instant."
    )
    database_url: str | None = _setting(
        None, "Where durable state lives: sqlite:///path/to/file.db (embedded, one process) or "
        "postgresql://user@host:port/db (scale-out). Defaults to ./.threadline/threadline.db."
    )
    redis_url: str | None = _setting(
        None, "Redis for stream events, wake-ups and cancel signals across processes (redis://host:port/db). "
        "Unset: a PostgreSQL database is the broker too (LISTEN/NOTIFY); SQLite keeps them in-process."
    )
    redis_key_prefix: str = _setting(
        "threadline", "Prefix of every Redis key and channel (without Redis: of the PostgreSQL broker's tables "
        "and channel), so deployments can share one Redis or database."
    )
    lease_seconds: float = _setting(
        30.0, "How long a worker's claim on a run lasts without a heartbeat (heartbeats every third of it). "
        "A run whose worker stopped heartbeating is retried or failed once its lease expires."
    )
    workers: int = _setting(
        10, "How many runs this process executes at once (in-process workers). 0 serves the API only.")
    run_retries: int = _setting(
        1, "How many times a run that was running when its process died is retried before it ends as error."
    )
    cron_poll_seconds: float = _setting(
        1.0, "How often each process that runs workers looks for due cron ticks (each tick fires once, whichever "
        "process claims it). A tick fires up to this long after its time."
    )
    max_body_bytes: int = _setting(10 * 1024 * 1024, "Largest request body accepted; larger ones get 413.")
    heartbeat_seconds: float = _setting(
        5.0, "Interval between keep-alive comments on open event streams, and between the newlines a wait for a "
        "run (/runs/wait, .../join) sends while the run goes on (as LangGraph's server: 5 s)."
    )
    stream_buffer_events: int = _setting(
        10_000, "Events kept per run for joins and Last-Event-ID resumption while the process lives."
    )
    stream_buffer_bytes: int = _setting(
        8 * 1024 * 1024, "Bytes of events kept per run for joins and Last-Event-ID resumption (its newest event "
        "always); the oldest go first."
    )
    stream_memory_bytes: int = _setting(
        256 * 1024 * 1024, "Bytes of events this process keeps for all runs together: past it, finished runs' "
        "events go first (oldest runs first), then the oldest events of the largest running one."
    )
    stream_finished_bytes: int = _setting(
        64 * 1024 * 1024, "Embedded (in-process broker): bytes of finished runs' events this process keeps for late "
        "joins and Last-Event-ID resumes, within stream_memory_bytes: past it, the runs that ended first are "
        "dropped whole (while a client of this process still reads the oldest, it and the runs after it are kept "
        "until it is done). 0: a finished run keeps nothing once no client reads it. With Redis or the PostgreSQL "
        "broker the events are in those services, bounded by stream_memory_bytes and their expiry."
    )
    database_pool_size: int = _setting(
        0, "PostgreSQL only: the most connections each of this process's pools holds (storage's, for writes, "
        "checkpoints and the store; without Redis, the broker's), reads having at most this many of their own "
        "too (at most 4). 0: the defaults, 10 for storage (+ 4 for reads) and 16 for the broker. Lower it to "
        "fit many processes under the server's max_connections."
    )
    stream_outbox_bytes: int = _setting(
        16 * 1024 * 1024, "With Redis or the PostgreSQL broker: bytes of events this process's runs may have posted "
        "and not yet stored there; past it, a run's next event waits until the broker caught up."
    )
    checkpoint_cache_bytes: int = _setting(
        16 * 1024 * 1024, "PostgreSQL: bytes of large checkpoint blobs (64 KiB or more each) this process keeps "
        "after reading them, so that the next read of a thread's state does not fetch the channel values that "
        "did not change (blob rows are never changed once written). The least recently used go first; 0: none."
    )
    # --- limits: run timeouts, rate limits, quotas and back-pressure (docs/configuration.md, "Limits")
    run_timeout_seconds: float = _setting(
        86400.0, "Longest a run may execute, from its start, before it is cancelled and ends `timeout` (0: no "
        "limit). LangGraph's BG_JOB_TIMEOUT_SECS is honoured when this is not set. An assistant's or a run's "
        "config.configurable.run_timeout_seconds overrides it for its runs."
    )
    rate_limit_runs: str = _setting(
        "", "Budget of run creation per identity (the authenticated caller, else the client address), as "
        "'10/second' or '600 per minute'; shared by every API process through Redis when redis_url is set. "
        "Refused credentials spend their address's budget. Empty: unlimited."
    )
    rate_limit_requests: str = _setting(
        "", "Budget of every other request per identity (GET /ok and /metrics are never limited). Empty: unlimited."
    )
    rate_limit_auth_failures: str = _setting(
        "20/minute", "Budget of refused credentials per client address, in each API process, with or without the "
        "other limits; once spent, the address's requests get 429 before authentication, valid credentials "
        "included, until the window refills. Empty: unlimited."
    )
    max_active_runs_per_identity: int = _setting(
        0, "Most pending + running runs one identity may have; past it, creating a run gets 429. 0: no cap."
    )
    max_active_runs: int = _setting(
        0, "Most pending + running runs of the whole deployment (the queue's bound); past it, 429. 0: no cap."
    )
    max_streams_per_identity: int = _setting(
        0, "Most event streams one identity may have open, counted across every API process of the deployment "
        "(through its broker); past it, 429. 0: no cap."
    )
    stream_lease_seconds: float = _setting(
        30.0, "How long a stream's place under max_streams_per_identity outlives its API process when the "
        "process dies without closing it (each process renews its places every third of this)."
    )
    stream_send_timeout_seconds: float = _setting(
        30.0, "A stream whose client has not taken a frame for this long (its connection's buffers are full) "
        "is closed; the run goes on, and the client can resume with Last-Event-ID. 0: never."
    )
    stream_coalesce_ms: float = _setting(
        2.0, "Events of a stream that come within this many milliseconds of its last write wait for that time "
        "and go out together in one write; the first event after a quiet spell goes out at once. 0: each batch "
        "of ready events at once. The same window groups a protocol run's events (/threads/{id}/commands) into "
        "the transactions that write them into the thread's log, and a run's events into the round trips "
        "that post them to Redis or PostgreSQL's broker (scale-out); a stream's end, a signal or a wake-up "
        "never waits."
    )
    stream_coalesce_max_ms: float = _setting(
        16.0, "While a stream's events keep coming faster than it writes (for more than 100 ms), the wait "
        "between its writes doubles from stream_coalesce_ms up to this many milliseconds (fewer writes per "
        "token); it falls back to stream_coalesce_ms once the stream pauses. At most stream_coalesce_ms: a "
        "fixed wait."
    )
    trusted_proxies: str = _setting(
        "", "Comma-separated addresses or CIDR blocks of reverse proxies whose X-Forwarded-For names the client."
    )
    ui: str = _setting("on", "The web console at /console (on), or none (off).", choices=("on", "off"))
    ui_bundler: str = _setting(
        "npx -y @langchain/langgraph-ui@1.5.1", "The command that bundles langgraph.json's `ui` components at "
        "startup (LangGraph's own bundler, on esbuild; it is given `build -o <folder>`, and under `threadline dev` "
        "also `watch -o <folder>`), or off: no bundle, and /ui/{graph} answers 404."
    )
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
                if raw is None and f.name in ENV_ALIASES:  # LangGraph's own name, so a deployment carries over
                    raw = env.get(ENV_ALIASES[f.name])
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
