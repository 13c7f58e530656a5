"""The SQL statements (`threadline/storage/statements.py`): both dialects define the same names, and every
statement, the named ones and those whose columns vary, prepares on both databases against the migrated
schema (SQLite: `EXPLAIN`, which compiles without running; PostgreSQL: `PREPARE`)."""

from __future__ import annotations

import re
import sqlite3

import psycopg
import pytest

from tests.services import Backend
from threadline.storage import crons, open_storage
from threadline.storage.statements import (
    CRON_COLUMNS,
    DIALECT_STATEMENTS,
    POSTGRES,
    RUN_COLUMNS_BUT_OUTPUT,
    SERVER_STATEMENTS,
    SQLITE,
    STATEMENTS,
    Dialect,
    order_by,
    statement_names,
    where,
)

THREAD_COLUMNS = ["thread_id", "status", "metadata", "config", "values", "interrupts", "error", "ttl_strategy",
                  "ttl_minutes", "created_at", "updated_at", "state_updated_at"]
RUN_COLUMNS = ["run_id", "thread_id", "assistant_id", "status", "metadata", "kwargs", "multitask_strategy",
               "available_at", "attempt", "worker_id", "created_at", "updated_at"]
ASSISTANT_COLUMNS = ["assistant_id", "graph_id", "name", "description", "config", "context", "metadata", "version",
                     "created_at", "updated_at"]


def test_both_dialects_define_the_same_statements() -> None:
    assert statement_names("sqlite") == statement_names("postgres")
    assert set(DIALECT_STATEMENTS["sqlite"]) == set(DIALECT_STATEMENTS["postgres"])
    assert not set(STATEMENTS) & set(DIALECT_STATEMENTS["sqlite"])  # a name is shared, or stated by each


def test_a_slot_is_filled_the_dialects_way() -> None:
    template = "UPDATE runs SET updated_at = {now} WHERE run_id {in:ids} AND worker_id = :w {skip_locked}"
    assert SQLITE.sql(template) == "UPDATE runs SET updated_at = :now WHERE run_id IN (SELECT value FROM " \
                                   "json_each(:ids)) AND worker_id = :w "
    assert POSTGRES.sql(template) == "UPDATE runs SET updated_at = now() WHERE run_id = ANY(%(ids)s) AND " \
                                     "worker_id = %(w)s FOR UPDATE SKIP LOCKED"
    assert POSTGRES.sql("SELECT '%' || :x::text") == "SELECT '%%' || %(x)s::text"


def every_statement(d: Dialect) -> dict[str, str]:
    """Each named statement (each part of one that is several) and each shape of those whose columns vary."""
    out = {f"{name}#{i}": sql for name in sorted(statement_names(d.name)) for i, sql in enumerate(d.statements(name))}
    if not d.sqlite:  # the calls of PostgreSQL's own functions
        out.update({f"server:{name}": d.statement(name) for name in SERVER_STATEMENTS})
    out["insert:threads"] = d.insert("threads", THREAD_COLUMNS, conflict="(thread_id) DO NOTHING RETURNING thread_id")
    out["insert:runs"] = d.insert("runs", RUN_COLUMNS, returning=True)
    out["insert:runs:leased"] = d.insert("runs", RUN_COLUMNS, lease=True, returning=True)
    out["insert:assistants"] = d.insert("assistants", ASSISTANT_COLUMNS, conflict="(assistant_id) DO NOTHING")
    out["update:threads"] = d.update("threads", THREAD_COLUMNS[1:], "thread_id", stamp=True)
    out["update:assistants"] = d.update("assistants", ASSISTANT_COLUMNS[1:], "assistant_id")
    for of_run in (False, True):
        for only_if_busy in (False, True):
            out[f"reconcile:{of_run}:{only_if_busy}"] = d.reconcile_thread(
                ["values", "interrupts", "error"], of_run=of_run, only_if_busy=only_if_busy)
    cond, _ = where(d, [("thread_id {in:ids}", {}), ("status = :status", {})],
                    metadata={"owner": {"a": [1, "x", None, True]}}, values={"n": 1.5},
                    filters={"owner": "a", "team": {"$contains": ["x", 2]}})
    out["search:threads"] = d.search("threads", cond, order_by("created_at", "desc", {"created_at"}, "created_at",
                                                               "thread_id"))
    out["count:threads"] = d.count("threads", cond)
    cond, _ = where(d, [("{ilike:name:name_like}", {})])
    out["search:assistants"] = d.search("assistants", cond, '"name" ASC')
    out["thread_events"] = d.thread_events(True, True)
    out["update:crons"] = d.update("crons", [c for c in CRON_COLUMNS if c != "cron_id"], "cron_id", returning=True)
    cond, _ = where(d, [("enabled = :enabled", {}), ("thread_id = :thread_id", {})], metadata={"k": 1})
    out["crons:search"] = d.search("crons", cond, order_by("next_run_date", "asc", crons.SORTABLE, "created_at",
                                                           "cron_id"))
    return out


async def test_every_statement_prepares_on_its_database(backend: Backend) -> None:
    storage = await open_storage(backend.database_url)  # the schema: our migrations and LangGraph's tables
    try:
        if backend.kind == "sqlite":
            prepare_on_sqlite(backend.database_url.removeprefix("sqlite:///"))
        else:
            await prepare_on_postgres(backend.database_url)
    finally:
        await storage.close()


async def test_a_runs_end_answers_every_column_of_the_run_but_its_output(backend: Backend) -> None:
    """`finish_run` names the columns it answers (all but `output`, which the caller has): a column added to
    `runs` later must be added there too, on both backends, or a finished run would come back without it."""
    storage = await open_storage(backend.database_url)
    try:
        if backend.kind == "sqlite":
            db = sqlite3.connect(backend.database_url.removeprefix("sqlite:///"))
            try:
                columns = [row[1] for row in db.execute("PRAGMA table_info(runs)")]
            finally:
                db.close()
        else:
            async with await psycopg.AsyncConnection.connect(backend.database_url, autocommit=True) as conn:
                cur = await conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = "
                                         "'runs' AND table_schema = current_schema() ORDER BY ordinal_position")
                columns = [row[0] for row in await cur.fetchall()]
    finally:
        await storage.close()
    assert sorted(RUN_COLUMNS_BUT_OUTPUT) == sorted(c for c in columns if c != "output")
    assert "output" in columns


def prepare_on_sqlite(path: str) -> None:
    db = sqlite3.connect(path)
    db.create_function("lower", 1, str.lower)
    try:
        for name, sql in every_statement(SQLITE).items():
            params = dict.fromkeys(re.findall(r"(?<![:\w]):([A-Za-z_]\w*)", sql))
            try:
                db.execute(f"EXPLAIN {sql}", params).fetchall()
            except sqlite3.Error as exc:
                pytest.fail(f"{name} does not prepare on SQLite: {exc}\n{sql}")
    finally:
        db.close()


async def prepare_on_postgres(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as db:
        for name, sql in every_statement(POSTGRES).items():
            numbers: dict[str, int] = {}
            # B023: the lambda runs inside re.sub, in this iteration
            numbered = re.sub(r"%\((\w+)\)s",
                              lambda m: f"${numbers.setdefault(m.group(1), len(numbers) + 1)}", sql)  # noqa: B023
            try:
                await db.execute(f"PREPARE threadline_check AS {numbered.replace('%%', '%')}", prepare=False)
            except psycopg.Error as exc:
                pytest.fail(f"{name} does not prepare on PostgreSQL: {exc}\n{numbered}")
            await db.execute("DEALLOCATE threadline_check")
