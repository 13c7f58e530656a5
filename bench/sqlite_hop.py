#!/usr/bin/env python
"""Why the embedded backend runs SQLite on the event loop: one key lookup through aiosqlite's thread
against the same lookup on the loop, on a WAL file. `python bench/sqlite_hop.py`."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path

import aiosqlite

N = 3000


async def main() -> None:
    path = str(Path(tempfile.mkdtemp()) / "hop.db")
    threaded = await aiosqlite.connect(path, isolation_level=None)
    await threaded.execute("PRAGMA journal_mode=WAL")
    await threaded.execute("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT)")
    await threaded.executemany("INSERT INTO t VALUES (?, ?)", [(str(i), "x" * 200) for i in range(1000)])
    inline = sqlite3.connect(path, isolation_level=None)
    sql = "SELECT * FROM t WHERE id = ?"
    started = time.perf_counter()
    for i in range(N):
        await threaded.execute_fetchall(sql, (str(i % 1000),))
    hop = (time.perf_counter() - started) / N
    started = time.perf_counter()
    for i in range(N):
        inline.execute(sql, (str(i % 1000),)).fetchall()
    loop = (time.perf_counter() - started) / N
    print(f"key lookup, {N} times: through aiosqlite's thread {hop * 1e6:.0f} µs, on the loop {loop * 1e6:.0f} µs")
    await threaded.close()
    inline.close()


if __name__ == "__main__":
    asyncio.run(main())
