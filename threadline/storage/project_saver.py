"""langgraph.json `checkpointer.path`: the project's own checkpointer in place of ours.

As LangGraph's server reads the key, `path` names an async context manager (an `@asynccontextmanager`
function) that yields a `BaseCheckpointSaver`; it is entered when storage opens and exited when it closes.
A saver instance, or a function returning one (or an awaitable of one), is accepted too.

Our tables (threads, runs, the queue) stay in the backend: only graph checkpoints go to the project's saver.
What the backend did on its own checkpoint tables in SQL is asked of the saver through LangGraph's API
instead: deleting a thread (`adelete_thread`), a rolled-back run's checkpoints (`adelete_for_runs`), copying a
thread (`acopy_thread`) and pruning (`aprune`). A saver that does not implement one of them raises
`NotImplementedError` from LangGraph's base class: a delete goes on without it (the checkpoints stay in the
saver, logged); a copy is made through `alist`, `aput` and `aput_writes` instead; a prune is refused (400).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from typing import Any, Literal

from langgraph.checkpoint.base import BaseCheckpointSaver

from threadline.errors import ConfigError, UnsupportedOperation
from threadline.shapes import FinalRunStatus
from threadline.storage.base import Storage
from threadline.storage.records import RunRecord

log = logging.getLogger("threadline.storage")


async def enter_saver(given: Any, stack: contextlib.AsyncExitStack) -> BaseCheckpointSaver[Any]:
    """The saver `checkpointer.path` names, entered on `stack` when it is a context manager."""
    found = given() if callable(given) and not isinstance(given, BaseCheckpointSaver) else given
    if hasattr(found, "__aenter__"):
        found = await stack.enter_async_context(found)
    elif hasattr(found, "__enter__") and not isinstance(found, BaseCheckpointSaver):
        found = stack.enter_context(found)
    elif inspect.isawaitable(found):
        found = await found
    if not isinstance(found, BaseCheckpointSaver):
        raise ConfigError(f"checkpointer.path must name an async context manager that yields a "
                          f"langgraph BaseCheckpointSaver (or a saver), got {type(found).__name__}")
    return found


class ProjectSaverStorage:
    """The backend, with the project's checkpointer (see the module docstring)."""

    def __init__(self, inner: Storage, saver: BaseCheckpointSaver[Any], stack: contextlib.AsyncExitStack) -> None:
        self.inner = inner
        self.checkpointer = saver
        self._stack = stack

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run_checkpointer(self, durability: str) -> Any:
        return self.checkpointer

    async def close(self) -> None:
        try:
            await self.inner.close()
        finally:
            await self._stack.aclose()

    async def _forget(self, thread_ids: list[str]) -> None:
        for thread_id in thread_ids:
            try:
                await self.checkpointer.adelete_thread(thread_id)
            except NotImplementedError:
                log.warning("the project's checkpointer cannot delete a thread (adelete_thread): the checkpoints "
                            "of thread %s stay in it", thread_id)

    async def delete_thread(self, thread_id: str) -> bool:
        deleted = await self.inner.delete_thread(thread_id)
        if deleted:
            await self._forget([thread_id])
        return deleted

    async def delete_expired_threads(self, *, limit: int, now: str | None = None) -> list[str]:
        deleted = await self.inner.delete_expired_threads(limit=limit, now=now)
        await self._forget(deleted)
        return deleted

    async def finish_run(self, run_id: str, status: FinalRunStatus, **kwargs: Any) -> RunRecord | None:
        finished = await self.inner.finish_run(run_id, status, **kwargs)
        if finished is not None and kwargs.get("delete_thread"):
            await self._forget([finished["thread_id"]])
        return finished

    async def delete_checkpoints_for_run(self, thread_id: str, run_id: str) -> None:
        try:
            await self.checkpointer.adelete_for_runs([run_id])
        except NotImplementedError:
            log.warning("the project's checkpointer cannot delete a run's checkpoints (adelete_for_runs): those of "
                        "run %s stay in thread %s", run_id, thread_id)

    async def copy_checkpoints(self, source_thread_id: str, target_thread_id: str) -> None:
        try:
            await self.checkpointer.acopy_thread(source_thread_id, target_thread_id)
        except NotImplementedError:
            await copy_through_api(self.checkpointer, source_thread_id, target_thread_id)

    async def prune_checkpoints(self, thread_id: str, strategy: Literal["delete", "keep_latest"]) -> None:
        if strategy == "delete":
            await self._forget([thread_id])
            return
        try:
            await self.checkpointer.aprune([thread_id], strategy=strategy)
        except NotImplementedError as exc:
            raise UnsupportedOperation("the project's checkpointer cannot prune checkpoints (aprune)") from exc


async def copy_through_api(saver: BaseCheckpointSaver[Any], source: str, target: str) -> None:
    """A thread's checkpoints and pending writes, oldest first, written again under `target`."""
    found = [t async for t in saver.alist({"configurable": {"thread_id": source}})]
    for item in reversed(found):
        configurable = {**item.config["configurable"], "thread_id": target}
        parent = (item.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        at = {"configurable": {**configurable, "checkpoint_id": parent} if parent else
              {k: v for k, v in configurable.items() if k != "checkpoint_id"}}
        saved = await saver.aput(at, item.checkpoint, {**item.metadata, "thread_id": target},  # type: ignore[arg-type,typeddict-unknown-key,typeddict-item]
                                 dict(item.checkpoint["channel_versions"]))
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in item.pending_writes or []:
            by_task.setdefault(task_id, []).append((channel, value))
        for task_id, writes in by_task.items():
            await saver.aput_writes(saved, writes, task_id)
