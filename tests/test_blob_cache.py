"""`storage/blob_cache.py`: large checkpoint blobs kept by bytes, and the PostgreSQL saver answering a read with
them instead of fetching them again (the answers of the API after updates, deletes and copies are in
test_threads.py, on both backends)."""

from __future__ import annotations

import uuid
from typing import Any, cast

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from threadline.storage import open_storage
from threadline.storage.blob_cache import BlobCache
from threadline.storage.postgres_saver import InlinePostgresSaver

BIG = 100_000  # bytes of a channel's value: past MIN_BLOB_BYTES


def test_kept_by_bytes_least_recently_used_first() -> None:
    cache = BlobCache(max_bytes=250, min_blob_bytes=50)
    cache.add("t1", "", "docs", "1", b"msgpack", b"a" * 100)
    cache.add("t2", "", "docs", "1", b"msgpack", b"b" * 100)
    cache.add("t1", "", "small", "1", b"msgpack", b"c" * 49)  # too small to be worth it
    cache.add("t3", "", "docs", "1", b"msgpack", b"d" * 300)  # larger than the whole budget
    assert cache.bytes == 200 and len(cache) == 2
    assert cache.held("t1", "") == {("docs", "1"): (b"msgpack", b"a" * 100)}  # now the most recently used
    cache.add("t3", "", "docs", "2", b"msgpack", b"e" * 100)
    assert cache.bytes == 200 and cache.held("t2", "") == {}  # t2's went first
    assert set(cache.held("t1", "")) == {("docs", "1")} and set(cache.held("t3", "")) == {("docs", "2")}
    cache.forget_thread("t1")
    assert cache.bytes == 100 and cache.held("t1", "") == {} and len(cache) == 1


async def _put(saver: Any, thread_id: str, docs: list[str], count: int) -> Any:
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"docs": docs, "count": count}
    checkpoint["channel_versions"] = {"docs": saver.get_next_version(None, None), "count": 1}
    return await saver.aput(config, checkpoint, {"source": "input", "step": 0}, checkpoint["channel_versions"])


async def test_a_held_blob_answers_the_read_and_is_not_fetched(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("the PostgreSQL saver")
    storage = await open_storage(database_url, checkpoint_cache_bytes=1024 * 1024)
    plain = await open_storage(database_url)
    try:
        saver, thread_id = cast(InlinePostgresSaver, storage.checkpointer), str(uuid.uuid4())
        cache = saver.blob_cache
        assert cache is not None and cast(InlinePostgresSaver, plain.checkpointer).blob_cache is None
        saved = await _put(saver, thread_id, ["x" * BIG], 1)
        first = await saver.aget_tuple(saved)
        assert first is not None and first.checkpoint["channel_values"] == {"docs": ["x" * BIG], "count": 1}
        assert len(cache) == 1 and cache.bytes > BIG
        # The row gone behind the saver's back: only the held bytes can answer now (a read that fetched the
        # blobs would miss the channel, as a saver without the cache does).
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute("DELETE FROM checkpoint_blobs WHERE thread_id = %s", (thread_id,))
        again = await saver.aget_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
        assert again is not None and again.checkpoint == first.checkpoint
        by_id = await saver.aget_tuple(saved)
        assert by_id is not None and by_id.checkpoint == first.checkpoint
        unheld = await plain.checkpointer.aget_tuple(saved)
        assert unheld is not None and "docs" not in unheld.checkpoint["channel_values"]
    finally:
        await storage.close()
        await plain.close()


async def test_past_its_bytes_the_oldest_blobs_are_fetched_again(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("the PostgreSQL saver")
    storage = await open_storage(database_url, checkpoint_cache_bytes=int(2.5 * BIG))
    try:
        saver = cast(InlinePostgresSaver, storage.checkpointer)
        cache = saver.blob_cache
        assert cache is not None
        threads = [str(uuid.uuid4()) for _ in range(3)]
        saved = [await _put(saver, t, [str(i) * BIG], i) for i, t in enumerate(threads)]
        for config in saved:
            assert (await saver.aget_tuple(config)) is not None
        assert len(cache) == 2 and cache.bytes <= int(2.5 * BIG)
        assert cache.held(threads[0], "") == {}  # the first went first
        found = await saver.aget_tuple(saved[0])
        assert found is not None and found.checkpoint["channel_values"]["docs"] == ["0" * BIG]
        assert set(cache.held(threads[0], "")) == {("docs", found.checkpoint["channel_versions"]["docs"])}
        assert cache.bytes <= int(2.5 * BIG)
        await storage.delete_thread(threads[0])  # nothing left to read: its memory goes to others
        assert cache.held(threads[0], "") == {}
    finally:
        await storage.close()
