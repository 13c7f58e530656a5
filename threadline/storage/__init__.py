"""Durable state: our tables, LangGraph's checkpointer and store, and the run queue.

Backends are chosen by URL and imported lazily. Storage never imports core or api.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadline.errors import ConfigError

if TYPE_CHECKING:
    from threadline.storage.base import Storage


async def open_storage(url: str, *, store_index: dict[str, Any] | None = None,
                       store_ttl: dict[str, Any] | None = None) -> Storage:
    """Open the backend `url` names (sqlite:///path or postgresql://…), applying its migrations."""
    if url.startswith("sqlite:"):
        from threadline.storage.sqlite import SQLiteStorage

        return await SQLiteStorage.open(url, store_index=store_index, store_ttl=store_ttl)
    if url.startswith(("postgresql:", "postgres:")):
        from threadline.storage.postgres import PostgresStorage

        return await PostgresStorage.open(url, store_index=store_index, store_ttl=store_ttl)
    raise ConfigError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://user@host:port/db")
