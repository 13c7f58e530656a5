"""A process's cache of large checkpoint blobs, bounded by bytes, for LangGraph's PostgreSQL saver.

LangGraph's PostgreSQL layout stores a checkpoint's channel values apart from it, one `checkpoint_blobs` row
per (thread, namespace, channel, version), and every read of a checkpoint fetches the blobs of every channel
it names, whether or not the value changed since the last read. A state of 1 MB costs about 0.5 ms of our CPU
per read to receive (and PostgreSQL its time to send), at each `GET /threads/{id}/state` and at the read
that starts each state update.

A blob row is never changed once written (LangGraph inserts it with `ON CONFLICT DO NOTHING`; a thread's
deletion or pruning deletes the rows, a copy writes new rows under the new thread's id), and a channel's next
version has a random part (`get_next_version`), so a thread deleted and made again under the same id does not
reuse a key. So the bytes of a row, once read, answer any later read of the same key: the saver
(`postgres_saver.py`) sends the keys it holds for the thread with its query, which leaves those rows out, and
puts the held bytes in their place. Only blobs of `MIN_BLOB_BYTES` or more are kept (a small one costs less
to fetch than to track); the least recently used go first past `max_bytes`. What is held are the bytes the
driver handed over (stored, so encrypted where the project encrypts), never the values built from them:
each read unpacks its own.
"""

from __future__ import annotations

from collections import OrderedDict

#: Blobs smaller than this are not kept.
MIN_BLOB_BYTES = 64 * 1024

Key = tuple[str, str, str, str]  # thread id, checkpoint namespace, channel, version
Held = dict[tuple[str, str], tuple[bytes, bytes]]  # (channel, version) -> (type, blob)


class BlobCache:
    """See the module docstring. `max_bytes` bounds the blobs' bytes held (0: nothing is kept)."""

    def __init__(self, max_bytes: int, min_blob_bytes: int = MIN_BLOB_BYTES) -> None:
        self.max_bytes = max_bytes
        self.min_blob_bytes = min_blob_bytes
        self.bytes = 0
        self._entries: OrderedDict[Key, tuple[bytes, bytes]] = OrderedDict()
        self._threads: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def held(self, thread_id: str, checkpoint_ns: str) -> Held:
        """The blobs held for the thread's namespace, by (channel, version), now the most recently used."""
        keys = self._threads.get((thread_id, checkpoint_ns))
        if not keys:
            return {}
        out: Held = {}
        for channel, version in keys:
            key = (thread_id, checkpoint_ns, channel, version)
            self._entries.move_to_end(key)
            out[(channel, version)] = self._entries[key]
        return out

    def add(self, thread_id: str, checkpoint_ns: str, channel: str, version: str, type_: bytes, blob: bytes) -> None:
        """Keep a blob read from the database (one smaller than `min_blob_bytes`, or than the whole budget,
        is not kept)."""
        size = len(blob)
        if size < self.min_blob_bytes or size > self.max_bytes:
            return
        key = (thread_id, checkpoint_ns, channel, version)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = (type_, blob)
        self._threads.setdefault((thread_id, checkpoint_ns), set()).add((channel, version))
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def forget_thread(self, thread_id: str) -> None:
        """Drop what is held for the thread (it was deleted: the memory is better spent on others)."""
        for thread_ns in [t for t in self._threads if t[0] == thread_id]:
            for channel, version in list(self._threads[thread_ns]):
                self._drop((*thread_ns, channel, version))

    def _drop(self, key: Key) -> None:
        _type, blob = self._entries.pop(key)
        self.bytes -= len(blob)
        thread_ns = (key[0], key[1])
        keys = self._threads[thread_ns]
        keys.discard((key[2], key[3]))
        if not keys:
            del self._threads[thread_ns]
