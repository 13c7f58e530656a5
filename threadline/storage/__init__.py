"""Durable state: our tables, LangGraph's checkpointer and store, and the run queue.

Backends are chosen by URL and imported lazily. Storage never imports core or api.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from threadline.errors import ConfigError

if TYPE_CHECKING:
    from langgraph.checkpoint.serde.base import SerializerProtocol

    from threadline.storage.base import Storage


async def open_storage(url: str, *, store_index: dict[str, Any] | None = None,
                       store_ttl: dict[str, Any] | None = None,
                       serde: SerializerProtocol | None = None, encryption: Any = None,
                       checkpointer: Any = None, caps_active_runs: bool = False,
                       checkpoint_cache_bytes: int = 0, pool_size: int = 0) -> Storage:
    """Open the backend `url` names (sqlite:///path or postgresql://…), applying its migrations; with the
    project's `checkpointer` (langgraph.json `checkpointer.path`: `project_saver.py`) in place of ours, and its
    `encryption` (a `langgraph_sdk.Encryption`: `encrypted.py`) applied to what is stored. `serde`: the
    checkpointer's serializer (`checkpoint_serde.py`); None, LangGraph's default. `caps_active_runs`: this
    process enqueues under a cap on active runs (`max_active_runs`, `max_active_runs_per_identity`), so the
    runs enqueued without one are counted from its start (PostgreSQL's quota slots, migration 0010).
    `checkpoint_cache_bytes`: PostgreSQL's cache of large checkpoint blobs (`blob_cache.py`), 0: none.
    `pool_size`: PostgreSQL's most pooled connections (`database_pool_size`; 0: the defaults)."""
    storage = await _open_backend(url, store_index=store_index, store_ttl=store_ttl, serde=serde,
                                  caps_active_runs=caps_active_runs, checkpoint_cache_bytes=checkpoint_cache_bytes,
                                  pool_size=pool_size)
    if checkpointer is not None:
        import contextlib

        from threadline.storage.project_saver import ProjectSaverStorage, enter_saver

        stack = contextlib.AsyncExitStack()
        try:
            saver = await enter_saver(checkpointer, stack)
        except BaseException:
            await storage.close()
            raise
        storage = cast("Storage", ProjectSaverStorage(storage, saver, stack))
    if encryption is not None:
        from threadline.storage.encrypted import EncryptedStorage
        from threadline.storage.encryption import Codec

        storage = cast("Storage", EncryptedStorage(storage, Codec(encryption)))
    return storage


async def _open_backend(url: str, *, store_index: dict[str, Any] | None, store_ttl: dict[str, Any] | None,
                        serde: SerializerProtocol | None, caps_active_runs: bool,
                        checkpoint_cache_bytes: int, pool_size: int = 0) -> Storage:
    if url.startswith("sqlite:"):
        from threadline.storage.sqlite import SQLiteStorage

        return await SQLiteStorage.open(url, store_index=store_index, store_ttl=store_ttl, serde=serde)
    if url.startswith(("postgresql:", "postgres:")):
        from threadline.storage.postgres import PostgresStorage

        return await PostgresStorage.open(url, store_index=store_index, store_ttl=store_ttl, serde=serde,
                                          caps_active_runs=caps_active_runs,
                                          checkpoint_cache_bytes=checkpoint_cache_bytes,
                                          **({"pool_size": pool_size} if pool_size > 0 else {}))
    raise ConfigError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://user@host:port/db")
