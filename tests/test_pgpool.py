"""The pools' checkout check (`threadline/pgpool.py`): a round trip only for a connection the server wrote to."""

from __future__ import annotations

import asyncio
import os
import resource

import psycopg
import pytest

from tests.services import PG_ADMIN_URL, ScaleOut
from threadline.broker import open_broker
from threadline.broker.postgres import PostgresBroker
from threadline.pgpool import readable
from threadline.storage import open_storage
from threadline.storage.postgres import PostgresStorage


async def _idle_then_terminated(conn: psycopg.AsyncConnection) -> tuple[bool, bool]:
    idle = readable(conn)
    async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    for _ in range(200):  # the server's goodbye arrives a moment after
        if readable(conn):
            return idle, True
        await asyncio.sleep(0.01)
    return idle, False


async def test_an_idle_connection_is_not_readable_and_a_terminated_one_is() -> None:
    async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as conn:
        assert await _idle_then_terminated(conn) == (False, True)


async def test_a_connection_past_descriptor_1024_is_checked_without_a_round_trip() -> None:
    """A server holding many streams has descriptors past 1024, which `select` cannot watch: an idle
    connection there must still read as idle, or every checkout pays a round trip."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open at most {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as conn:
            assert conn.pgconn.socket > 1024
            assert await _idle_then_terminated(conn) == (False, True)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_database_pool_size_bounds_each_pool_and_zero_keeps_the_defaults(scaleout_services: ScaleOut) -> None:
    """`database_pool_size` lets many processes fit under the server's max_connections: storage's pool, its
    reads' (at most 4) and the PostgreSQL broker's each hold at most that many connections."""
    url = scaleout_services.fresh().database_url
    for size, expected in ((2, (2, 2, 2)), (0, (10, 4, 16))):
        storage = await open_storage(url, pool_size=size)
        broker = open_broker(url, pool_size=size)
        try:
            assert isinstance(storage, PostgresStorage) and isinstance(broker, PostgresBroker)
            assert (storage._pool.max_size, storage._reads.max_size, broker._pool.max_size) == expected
        finally:
            await storage.close()
