"""The test suite's own hygiene: what a killed test session left in PostgreSQL and Redis is dropped by the
next session, and what a live session holds is kept."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest
import redis

from tests.services import DB_PREFIX, KEY_PREFIX, PG_ADMIN_URL, REDIS_URL, ScaleOut, owned_name, sweep_stale


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    return proc.pid


@pytest.mark.e2e  # a process that exits, as a killed session's
def test_sweep_drops_what_dead_or_old_sessions_left_and_keeps_live_ones(scaleout_services: ScaleOut) -> None:
    now = int(time.time())
    dead, old, live = (f"{DB_PREFIX}{_dead_pid()}_{now}_sweep", f"{DB_PREFIX}1_{now - 3 * 3600}_sweep",
                       owned_name(DB_PREFIX, "_"))
    keys = {"dead": f"{KEY_PREFIX}{_dead_pid()}-{now}-sweep:k", "old": f"{KEY_PREFIX}1-{now - 3 * 3600}-sweep:k",
            "live": f"{owned_name(KEY_PREFIX)}:k"}
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        for name in (dead, old, live):
            admin.execute(f'CREATE DATABASE "{name}"')
        client = redis.Redis.from_url(REDIS_URL)
        for key in keys.values():
            client.set(key, b"1")
        try:
            sweep_stale()
            left = {r[0] for r in admin.execute("SELECT datname FROM pg_database")}
            assert dead not in left and old not in left and live in left
            assert scaleout_services.dbname in left  # this session's own database
            assert [bool(client.exists(k)) for k in keys.values()] == [False, False, True]
        finally:
            for name in (dead, old, live):
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            client.delete(*keys.values())
            client.close()
