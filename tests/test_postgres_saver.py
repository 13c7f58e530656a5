"""The PostgreSQL checkpointer serializes a checkpoint's values and a task's writes, and reads them back, on
the caller's task (no thread hand-off), and stores them as LangGraph's saver does."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint

from threadline.storage import open_storage


async def test_checkpoints_and_writes_are_serialized_inline_and_read_back(database_url: str, monkeypatch) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("the PostgreSQL saver")
    storage = await open_storage(database_url)
    try:
        saver = storage.checkpointer
        config: RunnableConfig = {"configurable": {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}}

        async def no_thread(*args, **kwargs):
            raise AssertionError("serialization was handed to a thread")

        monkeypatch.setattr(asyncio, "to_thread", no_thread)
        checkpoint = empty_checkpoint()
        # A value that is not a primitive goes to the blobs table, serialized by `_dump_blobs`.
        checkpoint["channel_values"] = {"messages": [HumanMessage(content="hi", id="m1")], "count": 1}
        checkpoint["channel_versions"] = {"messages": 1, "count": 1}
        saved = await saver.aput(config, checkpoint, {"source": "loop", "step": 0}, {"messages": 1, "count": 1})
        task_id = str(uuid.uuid4())
        await saver.aput_writes(saved, [("messages", [{"role": "ai", "content": "hi"}]), ("count", 2)], task_id)
        found = await saver.aget_tuple(saved)
        monkeypatch.undo()
        assert found is not None
        assert found.checkpoint["channel_values"]["messages"][0].content == "hi"
        assert found.checkpoint["channel_values"]["count"] == 1
        assert [(t, c, v) for t, c, v in found.pending_writes] == [
            (task_id, "messages", [{"role": "ai", "content": "hi"}]), (task_id, "count", 2)]
        # Elsewhere, LangGraph's module still hands work to a thread.
        from langgraph.checkpoint.postgres import aio

        assert await aio.asyncio.to_thread(threading.get_ident) != threading.get_ident()
    finally:
        await storage.close()
