"""Moving stream events, wake-ups and cancel signals between the parts of a deployment.

The broker carries nothing durable: a lost wake-up costs latency, never a stuck run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from threadline.broker.base import Broker


_POSTGRES = ("postgresql://", "postgres://")


def broker_url(database_url: str, redis_url: str | None) -> str | None:
    """Which broker a deployment uses: Redis when it has one; else its PostgreSQL database (LISTEN/NOTIFY and
    UNLOGGED tables), so PostgreSQL alone scales out; else in-process (None: SQLite, one process)."""
    if redis_url:
        return redis_url
    return database_url if database_url.startswith(_POSTGRES) else None


def broker_kind(url: str | None) -> str:
    """"redis", "postgres" or "memory": what `open_broker(url)` opens (for /info and the banner)."""
    if url is None or url.startswith("memory:"):
        return "memory"
    return "postgres" if url.startswith(_POSTGRES) else "redis"


def open_broker(url: str | None, *, buffer_events: int = 10_000, buffer_bytes: int = 8 << 20,
                total_bytes: int = 256 << 20, key_prefix: str = "threadline", outbox_bytes: int = 16 << 20,
                pool_size: int = 0, finished_bytes: int = 64 << 20, coalesce_seconds: float = 0.0) -> Broker:
    """The broker `url` names (see `broker_url`); None means in-process (the embedded default). `pool_size`: the
    PostgreSQL broker's most pooled connections (0: its default). `finished_bytes`: the in-process broker's bound on
    finished runs' events (the shared brokers keep them in their service). `coalesce_seconds`: how long events
    posted to a shared broker right after a batch wait to go in the next one (`threadline.broker.outbox`)."""
    if url is None or url.startswith("memory:"):
        from threadline.broker.memory import MemoryBroker

        return MemoryBroker(buffer_events=buffer_events, buffer_bytes=buffer_bytes, total_bytes=total_bytes,
                            finished_bytes=finished_bytes)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from threadline.broker.redis import RedisBroker

        return RedisBroker(url, buffer_events=buffer_events, buffer_bytes=buffer_bytes, total_bytes=total_bytes,
                           key_prefix=key_prefix, outbox_bytes=outbox_bytes, coalesce_seconds=coalesce_seconds)
    if url.startswith(_POSTGRES):
        from threadline.broker.postgres import PostgresBroker

        return PostgresBroker(url, buffer_events=buffer_events, buffer_bytes=buffer_bytes, total_bytes=total_bytes,
                              key_prefix=key_prefix, outbox_bytes=outbox_bytes, coalesce_seconds=coalesce_seconds,
                              **({"max_connections": pool_size} if pool_size > 0 else {}))
    raise ValueError(f"unsupported broker URL {url!r}: use redis://host:port/db, or leave it unset")
