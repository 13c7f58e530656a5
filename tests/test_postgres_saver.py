"""The PostgreSQL checkpointer serializes a task's writes on the caller's task (no thread hand-off), and
stores them as LangGraph's saver does: they come back as the checkpoint's pending writes."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from threadline.storage import open_storage


async def test_writes_are_serialized_inline_and_read_back(database_url: str, monkeypatch) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("the PostgreSQL saver")
    storage = await open_storage(database_url)
    try:
        saver = storage.checkpointer
        config = {"configurable": {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}}
        saved = await saver.aput(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})

        async def no_thread(*args, **kwargs):  # noqa: ANN002, ANN003
            raise AssertionError("a task's writes were handed to a thread")

        monkeypatch.setattr(asyncio, "to_thread", no_thread)
        task_id = str(uuid.uuid4())
        await saver.aput_writes(saved, [("messages", [{"role": "ai", "content": "hi"}]), ("count", 2)], task_id)
        monkeypatch.undo()
        found = await saver.aget_tuple(saved)
        assert found is not None
        assert [(t, c, v) for t, c, v in found.pending_writes] == [
            (task_id, "messages", [{"role": "ai", "content": "hi"}]), (task_id, "count", 2)]
    finally:
        await storage.close()
