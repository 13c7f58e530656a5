"""Columns that hold large values, compressed with lz4 instead of PostgreSQL's default pglz where the server
has lz4: storage's (LangGraph's checkpoint blobs and writes, after its setup) and the PostgreSQL broker's
event data. pglz took most of the database's time to store a large state (a 1 MB blob or event: 5-6 ms,
lz4 about 1; bench/README.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import tuple_row


async def compress_with_lz4(conn: psycopg.AsyncConnection[Any], columns: Iterable[tuple[str, str]],
                            log: logging.Logger) -> None:
    """Each (table, column) set to lz4 once: a column already set is left alone, so a start takes no table
    lock; without lz4 (or before PostgreSQL 14), or with the table busy past `lock_timeout`, it stays as it
    is and the next start tries again. Rows keep their compression until they are written again. `conn` is
    in autocommit or a transaction (each column is a transaction, or a savepoint, of its own)."""
    for table, column in columns:
        try:
            async with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute("SELECT attcompression FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                                  "AND attname = %s", (table, column))
                found = await cur.fetchone()
                if found is None or found[0] == "l":
                    continue
                await cur.execute("SET LOCAL lock_timeout = '5s'")
                await cur.execute(f'ALTER TABLE {table} ALTER COLUMN "{column}" SET COMPRESSION lz4')
        except psycopg.Error as exc:
            log.info("%s.%s keeps its compression: %s", table, column, exc)
