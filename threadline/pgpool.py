"""The check psycopg_pool runs when it hands out a connection, shared by storage's pools and the PostgreSQL
broker's: a round trip only for a connection the server wrote to while it was idle (its goodbye, or EOF, when
it terminated it), not one per checkout (both hand out a connection per statement or two, and a check each
doubled their round trips)."""

from __future__ import annotations

import select
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool


def readable(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the server wrote to (or closed) an idle connection. `poll`, not `select`: a server holding many
    streams has descriptors past 1024, which `select` refuses (then every checkout would pay the round trip)."""
    try:
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.OperationalError):
        return True


async def check_at_checkout(conn: psycopg.AsyncConnection[Any]) -> None:
    if conn.broken or readable(conn):
        await AsyncConnectionPool.check_connection(conn)
