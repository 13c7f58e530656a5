"""The real services the scale-out backend is tested on: PostgreSQL and Redis, never mocks.

Each test session gets its own PostgreSQL database (dropped at the end); each test starts from empty
tables and its own Redis key prefix. Where the services cannot be reached, tests skip, except under
CI (`CI=true`), where they fail.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import psycopg
import pytest
import redis

PG_ADMIN_URL = os.environ.get("THREADLINE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
# "memory" runs the PostgreSQL tests with the in-process broker (single process), for debugging storage alone.
REDIS_URL = os.environ.get("THREADLINE_TEST_REDIS", "redis://127.0.0.1:6379/0")


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason} (CI=true: the scale-out backend must be tested)")
    pytest.skip(reason)


@dataclass(frozen=True)
class Backend:
    """One test's backend: the settings a server (in-process or a real process) needs to use it."""

    kind: str
    database_url: str
    redis_url: str | None = None
    redis_key_prefix: str | None = None

    def settings(self) -> dict[str, str]:
        out = {"database_url": self.database_url}
        if self.redis_url:
            out.update(redis_url=self.redis_url, redis_key_prefix=self.redis_key_prefix or "threadline")
        return out

    def env(self) -> dict[str, str]:
        return {f"THREADLINE_{k.upper()}": v for k, v in self.settings().items()}


class ScaleOut:
    """A PostgreSQL database for this test session and the Redis server."""

    def __init__(self, admin: psycopg.Connection, dbname: str, url: str, prefix: str) -> None:
        self._admin = admin
        self.dbname = dbname
        self.url = url
        self.prefix = prefix
        self._conn: psycopg.Connection | None = None

    @classmethod
    def connect(cls) -> ScaleOut:
        try:
            admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            unavailable(f"PostgreSQL unreachable at {PG_ADMIN_URL}: {exc}")
        try:
            if REDIS_URL != "memory":
                redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5).ping()
        except redis.RedisError as exc:
            admin.close()
            unavailable(f"Redis unreachable at {REDIS_URL}: {exc}")
        token = uuid.uuid4().hex[:10]
        dbname = f"threadline_test_{token}"
        admin.execute(f'CREATE DATABASE "{dbname}"')
        info = psycopg.conninfo.conninfo_to_dict(PG_ADMIN_URL)
        url = f"postgresql://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{dbname}"
        return cls(admin, dbname, url, f"tltest-{token}")

    def fresh(self) -> Backend:
        """Empty every table (ours, the checkpointer's, the store's); a new Redis key prefix."""
        if self._conn is None:
            self._conn = psycopg.connect(self.url, autocommit=True)
        tables = [r[0] for r in self._conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename NOT LIKE '%migrations'")]
        sequences = [r[0] for r in self._conn.execute(
            "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'")]
        # DELETE, not TRUNCATE: a test leaves a few rows, and TRUNCATE's new files cost 60-180 ms a test
        # where these statements take a few. The one foreign key (assistant_versions) cascades.
        statements = [f'DELETE FROM "{t}"' for t in tables] + [f'ALTER SEQUENCE "{q}" RESTART' for q in sequences]
        if statements:
            self._conn.execute("; ".join(statements))  # type: ignore[arg-type]
        if REDIS_URL == "memory":  # PostgreSQL with the in-process broker: one process only
            return Backend("postgres", self.url)
        return Backend("postgres", self.url, REDIS_URL, f"{self.prefix}-{uuid.uuid4().hex[:8]}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._admin.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')
        self._admin.close()
        if REDIS_URL == "memory":
            return
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
        client.close()
