"""The real services the scale-out backend is tested on: PostgreSQL and Redis, never mocks.

Each test session gets its own PostgreSQL database (dropped at the end); each test starts from empty
tables and its own Redis key prefix. Where the services cannot be reached, tests skip, except under
CI (`CI=true`), where they fail.

Names carry the creating process's id and the time (`owned_name`), so a session that was killed before
its teardown (a timeout, SIGKILL) leaves nothing for ever: every session starts by dropping the databases
and keys of test processes that are gone, or that are older than `STALE_SECONDS` (`sweep_stale`). Sessions
running at the same time on the machine keep theirs.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import redis

PG_ADMIN_URL = os.environ.get("THREADLINE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
# "memory" runs the PostgreSQL tests without Redis: PostgreSQL is then the broker too (PostgresBroker).
REDIS_URL = os.environ.get("THREADLINE_TEST_REDIS", "redis://127.0.0.1:6379/0")


DB_PREFIX = "threadline_test_"
KEY_PREFIX = "tltest-"
STALE_SECONDS = 2 * 3600
_OWNED = re.compile(r"(\d+)[-_](\d+)[-_]")  # <pid>-<unix time>- after the prefix


def owned_name(prefix: str, sep: str = "-") -> str:
    """`prefix` + this process's id, the time and a random token: unique, and sweepable once stale."""
    return f"{prefix}{os.getpid()}{sep}{int(time.time())}{sep}{uuid.uuid4().hex[:8]}"


def _stale(name: str, prefix: str) -> bool:
    """Whether `name` was made by a test process that is gone, or long ago. Names without an owner (made
    before names carried one) are left to `_stale_unowned`."""
    found = _OWNED.match(name[len(prefix):])
    if found is None:
        return False
    pid, made = int(found.group(1)), int(found.group(2))
    if time.time() - made > STALE_SECONDS:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True  # the process that made it is gone (its teardown never ran)
    except PermissionError:
        return False  # alive, another user's
    return False


def sweep_stale() -> None:
    """Drop the test databases and Redis keys that dead or old test sessions left. Best effort: services
    that cannot be reached are someone else's problem (the tests that need them skip or fail)."""
    with contextlib.suppress(psycopg.Error), psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
        names = [r[0] for r in admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                             (DB_PREFIX.replace("_", "\\_") + "%",))]
        for name in names:
            if _stale(name, DB_PREFIX) or _stale_unowned_database(admin, name):
                with contextlib.suppress(psycopg.Error):
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if REDIS_URL == "memory":
        return
    with contextlib.suppress(redis.RedisError):
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=10)
        try:
            doomed = [key for key in client.scan_iter(match=f"{KEY_PREFIX}*", count=1000)
                      if _stale(key.decode(errors="replace"), KEY_PREFIX)
                      or (_OWNED.match(key.decode(errors="replace")[len(KEY_PREFIX):]) is None
                          and (client.object("idletime", key) or 0) > STALE_SECONDS)]
            for start in range(0, len(doomed), 500):
                client.delete(*doomed[start:start + 500])
        finally:
            client.close()


def _stale_unowned_database(admin: psycopg.Connection, name: str) -> bool:
    """A database named before names carried an owner: stale when its files are older than `STALE_SECONDS`
    (read with pg_stat_file, which needs a superuser; otherwise it is kept)."""
    if _OWNED.match(name[len(DB_PREFIX):]) is not None:
        return False
    try:
        row = admin.execute(
            "SELECT extract(epoch FROM now() - (pg_stat_file('base/' || oid || '/PG_VERSION')).modification) "
            "FROM pg_database WHERE datname = %s", (name,)).fetchone()
    except psycopg.Error:
        return False
    return row is not None and row[0] is not None and float(row[0]) > STALE_SECONDS


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

    def settings(self) -> dict[str, Any]:
        """The `Settings` fields that point a server at this backend."""
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
        dbname = owned_name(DB_PREFIX, "_")
        admin.execute(f'CREATE DATABASE "{dbname}"')
        info = psycopg.conninfo.conninfo_to_dict(PG_ADMIN_URL)
        url = (f"postgresql://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:"
               f"{info.get('port', 5432)}/{dbname}")
        return cls(admin, dbname, url, owned_name(KEY_PREFIX))

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
            self._conn.execute("; ".join(statements))
        if REDIS_URL == "memory":  # PostgreSQL alone: it is the broker too
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
