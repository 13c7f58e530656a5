"""Rate limits counted in PostgreSQL, for deployments whose only service is PostgreSQL (issue 28).

A `limits` storage for its sliding window counter strategy (the one `api/ratelimit.py` uses): one row per
key in the broker's UNLOGGED `<prefix>_broker_windows` table, taken in one statement on the database's
clock, so every API process of a deployment spends one budget, as they do through Redis. Rows are swept by
the broker's sweep once their key counts for nothing (two windows after its last hit).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from limits.aio.storage import SlidingWindowCounterSupport, Storage

from threadline.broker.pgsql import PgNames

#: Runs one statement in the broker's pool (within its outage accounting) and returns its rows.
Query = Callable[[str, Mapping[str, Any]], Awaitable[list[tuple[Any, ...]]]]


class PostgresWindows(Storage, SlidingWindowCounterSupport):
    """Sliding windows in the PostgreSQL broker's database. Only the sliding window counter strategy is
    supported: the fixed-window calls (`incr`, `get`, `get_expiry`) raise NotImplementedError."""

    STORAGE_SCHEME = None  # made by `PostgresBroker.rate_counters`, never from a URL

    def __init__(self, query: Query, names: PgNames, ping: Callable[[], Awaitable[None]]) -> None:
        super().__init__()
        self._query, self._names, self._ping = query, names, ping

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return Exception

    async def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        rows = await self._query(self._names.window_take,
                                          {"key": key, "limit": limit, "expiry": expiry, "amount": amount})
        return bool(rows[0][0])

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        """(previous count, its weight in seconds, current count, seconds until it is the previous), as
        `limits`' own storages give them."""
        rows = await self._query(self._names.window_read, {"key": key, "expiry": expiry})
        if not rows:
            return 0, 0.0, 0, 2.0 * expiry
        prev, cur, now = rows[0]
        left = expiry - now % expiry  # of the current window
        return int(prev), (left if prev else 0.0), int(cur), left + expiry

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        await self.clear(key)

    async def clear(self, key: str) -> None:
        await self._query(self._names.window_clear, {"key": key})

    async def reset(self) -> int | None:
        rows = await self._query(self._names.windows_reset, {})
        return int(rows[0][0])

    async def check(self) -> bool:
        try:
            await self._ping()
        except Exception:  # noqa: BLE001 - `check` answers whether the storage works, it does not raise
            return False
        return True

    async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        raise NotImplementedError("PostgresWindows counts sliding windows only")

    async def get(self, key: str) -> int:
        raise NotImplementedError("PostgresWindows counts sliding windows only")

    async def get_expiry(self, key: str) -> float:
        raise NotImplementedError("PostgresWindows counts sliding windows only")
