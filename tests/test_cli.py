"""The `threadline` command's other verbs: `worker` refuses a setup it cannot serve; `migrate` creates the schema."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import threadline
from tests.conftest import PROJECT

pytestmark = pytest.mark.e2e  # each test starts the `threadline` command


def _threadline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "threadline", *args], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[1])


def test_worker_refuses_an_embedded_database(tmp_path: Path) -> None:
    done = _threadline("worker", "--config", str(PROJECT), "--database-url", f"sqlite:///{tmp_path / 'x.db'}")
    assert done.returncode == 2
    assert "needs a shared database" in done.stderr
    assert not (tmp_path / "x.db").exists()  # refused before touching anything


def test_migrate_creates_the_schema_and_is_repeatable(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    first = _threadline("migrate", "--database-url", f"sqlite:///{db}")
    assert first.returncode == 0, first.stderr
    shipped = sorted(p.name for p in (Path(threadline.__file__).parent / "storage/migrations/sqlite").glob("*.sql"))
    assert f"applied {len(shipped)} migrations ({', '.join(shipped)})" in first.stdout  # not "up to date"
    again = _threadline("migrate", "--database-url", f"sqlite:///{db}")
    assert again.returncode == 0, again.stderr
    assert "already up to date" in again.stdout and "applied" not in again.stdout
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"assistants", "threads", "runs", "threadline_migrations", "checkpoints", "store"} <= tables
