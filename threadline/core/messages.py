"""The two shapes of message streaming: `messages-tuple` and LangGraph's `messages/*` events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from langchain_core.messages import BaseMessage, BaseMessageChunk, message_chunk_to_message

from threadline.core.partials import PartialEncoder
from threadline.serde import dumps


class MessageStreamer:
    """Turns LangGraph `messages` chunks `(message, metadata)` into the events a client asked for. The
    `messages` (tuple) and `messages/partial` events come in their held form (`threadline.core.partials`): a
    delta from the message's previous frame, rebuilt for each subscriber."""

    def __init__(self, *, legacy: bool, tuples: bool) -> None:
        self.legacy = legacy
        self.tuples = tuples
        self._seen: dict[str, BaseMessage] = {}
        self._partials = PartialEncoder()

    def feed(self, chunk: tuple[Any, dict[str, Any]]) -> Iterator[tuple[str, Any]]:
        message, metadata = chunk
        if self.tuples:
            msg_id = getattr(message, "id", None) or ""
            yield "messages", self._partials.encode(msg_id, dumps([message, metadata]))
        if not self.legacy:
            return
        msg_id = getattr(message, "id", None) or ""
        if msg_id not in self._seen:
            yield "messages/metadata", {msg_id: {"metadata": metadata}}
            self._seen[msg_id] = message
        else:
            prev = self._seen[msg_id]
            if isinstance(prev, BaseMessageChunk) and isinstance(message, BaseMessageChunk):
                self._seen[msg_id] = prev + message
            else:
                self._seen[msg_id] = message
        current = self._seen[msg_id]
        if isinstance(message, BaseMessageChunk):
            # The message so far, as a whole message (`"type": "ai"`, not `"AIMessageChunk"`): as LangGraph's
            # server sends it, and as UIs that render `messages/partial` by type expect.
            yield "messages/partial", self._partials.encode(msg_id, dumps([message_chunk_to_message(current)]))
        else:
            self._partials.forget(msg_id)
            yield "messages/complete", [current]
