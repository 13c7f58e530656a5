"""LangGraph's checkpointer and store with the project's encryption (`encryption.py`) in front of them.

`EncryptedSaver` wraps any `BaseCheckpointSaver` (ours on either database, or the project's own): each
channel value of a checkpoint and each pending write is serialized by the saver's serializer, sealed by the
blob encryptor, and handed to the saver as `bytes` (which every saver stores as they are: so no value stays
inline in PostgreSQL's `checkpoints.checkpoint` jsonb, and SQLite's checkpoint blob holds only ciphertext).
A checkpoint's metadata (which LangGraph fills from the run's config and metadata) goes through the JSON
encryptor. Reads open them again. `EncryptedStore` does the same for the store's item values.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple, get_checkpoint_metadata
from langgraph.store.base import BaseStore, Item, Op, PutOp, Result, SearchItem

from threadline.storage.encryption import BLOB_MAGIC, Codec
from threadline.storage.saver_wrapper import SaverWrapper


class EncryptedSaver(SaverWrapper):
    """See the module docstring. Deletes, copies and versions are the wrapped saver's."""

    def __init__(self, inner: BaseCheckpointSaver[Any], codec: Codec) -> None:
        super().__init__(inner)
        self.codec = codec

    # --- values ---------------------------------------------------------------------------------
    async def _seal(self, value: Any) -> Any:
        if self.codec._blob_enc is None:
            return value
        type_, data = self.serde.dumps_typed(value)
        kind = type_.encode()
        return await self.codec.seal_blob("checkpoint", len(kind).to_bytes(2, "big") + kind + data)

    async def _open(self, value: Any) -> Any:
        if not isinstance(value, (bytes, bytearray)) or not bytes(value).startswith(BLOB_MAGIC):
            return value
        plain = await self.codec.open_blob("checkpoint", bytes(value))
        size = int.from_bytes(plain[:2], "big")
        return self.serde.loads_typed((plain[2:2 + size].decode(), plain[2 + size:]))

    async def _open_tuple(self, found: CheckpointTuple | None) -> CheckpointTuple | None:
        if found is None:
            return None
        checkpoint = {**found.checkpoint, "channel_values": {
            k: await self._open(v) for k, v in found.checkpoint.get("channel_values", {}).items()}}
        writes = [(task, channel, await self._open(value)) for task, channel, value in found.pending_writes or []]
        metadata = await self.codec.open("checkpoint", "metadata", dict(found.metadata or {}))
        return CheckpointTuple(found.config, checkpoint, metadata, found.parent_config,  # type: ignore[arg-type]
                               writes if found.pending_writes is not None else None)

    # --- the async saver ----------------------------------------------------------------------------
    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        sealed = {**checkpoint, "channel_values": {k: await self._seal(v)
                                                    for k, v in checkpoint.get("channel_values", {}).items()}}
        # Complete it as the saver would (from the run's config), then encrypt it whole.
        meta = await self.codec.seal("checkpoint", "metadata", dict(get_checkpoint_metadata(config, metadata)))
        return await self.inner.aput(config, sealed, meta, new_versions)  # type: ignore[arg-type]

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        sealed = [(channel, await self._seal(value)) for channel, value in writes]
        await self.inner.aput_writes(config, sealed, task_id, task_path)

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        return await self._open_tuple(await self.inner.aget_tuple(config))

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
        async for found in self.inner.alist(config, **kwargs):
            opened = await self._open_tuple(found)
            if opened is not None:
                yield opened

    async def adelete_thread(self, thread_id: str) -> None:
        await self.inner.adelete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.inner.adelete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.inner.acopy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.inner.aprune(thread_ids, strategy=strategy)


class EncryptedStore(BaseStore):
    """The store, its items' values sealed by the JSON encryptor (model `store`, field `value`). A search's
    `filter` is matched against what is stored: an encrypted value matches no filter (as LangGraph documents),
    and a semantic index would embed ciphertext, so a project that encrypts its store values should leave
    `store.index` off or keep the indexed fields out of its encryptor's reach."""

    #: TTLs are the wrapped store's to honour or refuse: they pass through with each operation.
    supports_ttl = True

    def __init__(self, inner: BaseStore, codec: Codec) -> None:
        self.inner = inner
        self.codec = codec

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def ttl_config(self) -> Any:  # type: ignore[override]
        return self.inner.ttl_config

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        raise NotImplementedError("the encrypted store is asynchronous: use abatch")

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        sealed: list[Op] = []
        for op in ops:
            if isinstance(op, PutOp) and op.value is not None:
                op = op._replace(value=await self.codec.seal("store", "value", op.value))
            sealed.append(op)
        results = await self.inner.abatch(sealed)
        return [await self._open(result) for result in results]

    async def _open(self, result: Any) -> Any:
        if isinstance(result, (Item, SearchItem)):
            result.value = await self.codec.open("store", "value", result.value)
        elif isinstance(result, list):
            return [await self._open(r) for r in result]
        return result
