"""Small helpers shared by the SQL backends: JSON columns and their encoding, migrations, timestamps."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import orjson

JSON_COLUMNS = {"config", "context", "metadata", "values", "interrupts", "error", "kwargs", "output"}
#: The JSON columns PostgreSQL keeps as `json`, the text as written, rather than `jsonb` (migration 0019): a
#: thread's values and a run's output (the same values again for a thread run), which can be large and are
#: written whole and read far more often than searched.
TEXT_JSON_COLUMNS = {"values", "output"}


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def iso_after(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(timespec="microseconds")


def thread_ttl_columns(minutes: float | None) -> dict[str, Any]:
    """The thread columns that make it expire `minutes` after its last update ("delete": the only strategy)."""
    return {"ttl_strategy": "delete", "ttl_minutes": minutes} if minutes is not None else {}


def dumps(value: Any) -> str:
    """A JSON column's text. orjson, as LangGraph's server: NaN and Infinity become null (PostgreSQL's jsonb
    has no such values). The standard encoder only for what orjson refuses (an int beyond 64 bits), with NaN
    and Infinity made null first as well: the text is valid JSON either way, since an answer may write it out
    as it is (`get_thread(..., values="text")`)."""
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(_finite(value), separators=(",", ":"), ensure_ascii=False, default=str)


def _finite(value: Any) -> Any:
    """`value` with every float that is not finite (NaN, Infinity) replaced by None, in dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def loads(text: str | bytes) -> Any:
    """A JSON column's value from the text `dumps` wrote (SQLite's columns, PostgreSQL's `TEXT_JSON_COLUMNS`):
    orjson (a few times faster), else the standard parser, for what orjson refuses: a lone surrogate's escape,
    and the NaN or Infinity that `dumps`'s fallback wrote before it made them null (rows of older versions)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def filter_terms(filters: dict[str, Any] | None) -> list[tuple[str, str, Any]]:
    """An authorization filter (`langgraph_sdk.Auth.types.FilterType`, what an `@auth.on` handler returns) as
    (metadata key, `$eq` | `$contains`, value) terms, ANDed: `{"owner": "a"}` and `{"owner": {"$eq": "a"}}`
    are equality; `{"tags": {"$contains": "x"}}` and `{"tags": {"$contains": ["x", "y"]}}` need the key's list
    to hold every value (given as a list here). Anything else is a `ValueError`: a filter that cannot be
    applied must never widen what a caller sees."""
    terms: list[tuple[str, str, Any]] = []
    for key, wanted in (filters or {}).items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"filter key must be a non-empty string, got {key!r}")
        if isinstance(wanted, dict):
            if len(wanted) != 1 or next(iter(wanted)) not in ("$eq", "$contains"):
                raise ValueError(f"filter on {key!r}: an operator object is {{'$eq': v}} or {{'$contains': v}}")
            op, value = next(iter(wanted.items()))
            if op == "$contains":
                value = list(value) if isinstance(value, (list, tuple)) else [value]
                if not value or any(isinstance(v, (dict, list)) for v in value):
                    raise ValueError(f"filter on {key!r}: $contains takes a value or a non-empty list of values")
            terms.append((key, op, value))
        elif isinstance(wanted, (list, tuple)):
            raise ValueError(f"filter on {key!r}: use {{'$contains': [...]}} for lists")
        else:
            terms.append((key, "$eq", wanted))
    return terms


MIGRATIONS_TABLE = "CREATE TABLE IF NOT EXISTS threadline_migrations (name TEXT PRIMARY KEY, applied_at TEXT)"


def pending_migrations(dialect: str, done: set[str]) -> list[tuple[str, str]]:
    """(name, SQL) of the numbered `.sql` files under migrations/<dialect> not yet recorded, in order."""
    folder = resources.files("threadline.storage") / "migrations" / dialect
    return [(entry.name, entry.read_text()) for entry in sorted(folder.iterdir(), key=lambda p: p.name)
            if entry.name.endswith(".sql") and entry.name not in done]


async def apply_migrations(conn: Any, dialect: str) -> list[str]:
    """SQLite: apply the pending migrations; each commits with its record, or not at all."""
    await conn.execute(MIGRATIONS_TABLE)
    async with conn.execute("SELECT name FROM threadline_migrations") as cur:
        done = {r[0] for r in await cur.fetchall()}
    applied = []
    for name, script in pending_migrations(dialect, done):
        record = f"INSERT INTO threadline_migrations (name, applied_at) VALUES ('{name}', '{now_iso()}');"
        await conn.executescript(f"BEGIN;\n{script}\n{record}\nCOMMIT;")
        applied.append(name)
    return applied
