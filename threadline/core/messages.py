"""The two shapes of message streaming: `messages-tuple` and LangGraph's `messages/*` events."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, BaseMessageChunk, message_chunk_to_message
from pydantic import BaseModel

from threadline.core.partials import Held, PartialEncoder
from threadline.serde import dumps, loads, model_json

#: Stands for a streamed message's text while the rest of the message is serialized (its JSON is cut there).
_TEXT = "\x00threadline:text\x00"
_TEXT_JSON = dumps(_TEXT)[1:-1]


#: A chunk's type and its fields but the content (its `__dict__` and pydantic's extra fields).
_Fields = tuple[type, dict[str, Any], dict[str, Any] | None]


@dataclass
class _Reply:
    """A message streamed as chunks of text: the chunks merged with their text left out, and the text apart,
    JSON-escaped (JSON escapes each character alone, so the text's escaped form grows by each chunk's)."""

    rest: BaseMessageChunk  # the merged chunks, with "" for content
    text: bytearray = field(default_factory=bytearray)
    # The frame cut around the text (`rest` serialized: head, tail), None when it could not be cut there.
    cut: tuple[bytes, bytes] | None = None
    # The fields (all but the content) of a chunk whose merge left `rest` as it was: a chunk with the same
    # fields leaves it as it is too (the merge is a function of the fields' values), and the same cut.
    idle: _Fields | None = None

    def whole(self) -> BaseMessageChunk:
        return self.rest.model_copy(update={"content": loads(b'"' + self.text + b'"')})


class MessageStreamer:
    """Turns LangGraph `messages` chunks `(message, metadata)` into the events a client asked for. The
    `messages` (tuple) and `messages/partial` events come in their held form (`threadline.core.partials`): a
    delta from the message's previous frame, rebuilt for each subscriber.

    A `messages/partial` frame is the whole message so far. Built whole for each chunk, a reply of n chunks
    costs O(n²) to merge and serialize; a message whose chunks carry text is instead merged without its text,
    serialized once per chunk with a marker for it, and cut around the marker: the frame is that head, the
    text so far and that tail, byte for byte the whole message's JSON, and its delta is the chunk's text. A chunk
    whose fields besides its text are those of a chunk whose merge changed nothing (most chunks of a reply:
    text alone) is not merged or cut again: its frame is the same head and tail around the longer text."""

    def __init__(self, *, legacy: bool, tuples: bool) -> None:
        self.legacy = legacy
        self.tuples = tuples
        self._seen: dict[str, BaseMessage | _Reply] = {}
        self._partials = PartialEncoder()
        # The last metadata serialized, and its JSON: LangGraph passes the same dict with every chunk of a
        # model call, and it is most of a `messages` tuple's bytes (held by reference: an id is not reused).
        self._metadata: tuple[Any, bytes] = (None, b"null")

    def feed(self, chunk: tuple[Any, dict[str, Any]]) -> Iterator[tuple[str, Any]]:
        message, metadata = chunk
        if self.tuples:
            msg_id = getattr(message, "id", None) or ""
            if metadata is not self._metadata[0]:
                self._metadata = (metadata, dumps(metadata))
            # `[message, metadata]` as `dumps` writes it (no spaces), the metadata serialized once.
            body = model_json(message) if isinstance(message, BaseModel) else dumps(message)
            end = _content_end(body, message)
            if end:  # the frame around the chunk's text: most chunks of a reply differ from the last in it alone
                yield "messages", self._partials.encode_around(msg_id, _TUPLE_HEAD, body[_TEXT_START:end],
                                                               body[end:] + b"," + self._metadata[1] + b"]")
            else:
                yield "messages", self._partials.encode(msg_id, b"[" + body + b"," + self._metadata[1] + b"]")
        if not self.legacy:
            return
        msg_id = getattr(message, "id", None) or ""
        first = msg_id not in self._seen
        if first:
            yield "messages/metadata", {msg_id: {"metadata": metadata}}
        if isinstance(message, BaseMessageChunk):
            # The message so far, as a whole message (`"type": "ai"`, not `"AIMessageChunk"`): as LangGraph's
            # server sends it, and as UIs that render `messages/partial` by type expect.
            yield "messages/partial", self._partial(msg_id, message, None if first else self._seen[msg_id])
        else:
            self._seen[msg_id] = message
            self._partials.forget(msg_id)
            yield "messages/complete", [message]

    def _partial(self, msg_id: str, message: BaseMessageChunk, prev: BaseMessage | _Reply | None) -> Held:
        if isinstance(message.content, str) and (prev is None or isinstance(prev, _Reply)):
            fields = _fields(message)
            if prev is not None and prev.idle is not None and prev.cut is not None and fields == prev.idle:
                # Most chunks of a reply carry text only (their other fields the same each time): merging
                # one changes nothing but the text, and the frame is the same head and tail around more text.
                piece = dumps(message.content)[1:-1]
                prev.text += piece
                return self._partials.encode_parts(msg_id, prev.cut[0], prev.text, prev.cut[1], len(piece))
            rest = message.model_copy(update={"content": ""})
            reply = _Reply(rest) if prev is None else prev
            before = reply.rest
            if prev is not None:
                reply.rest = reply.rest + rest
            self._seen[msg_id] = reply
            piece = dumps(message.content)[1:-1]
            reply.text += piece
            cut = _listed(message_chunk_to_message(reply.rest.model_copy(update={"content": _TEXT}))).split(_TEXT_JSON)
            was, reply.cut = reply.cut, (cut[0], cut[1]) if len(cut) == 2 else None
            reply.idle = fields if (prev is not None and reply.cut is not None and reply.cut == was
                                    and _same(before, reply.rest)) else None
            if reply.cut is not None:
                return self._partials.encode_parts(msg_id, reply.cut[0], reply.text, reply.cut[1], len(piece))
            current: BaseMessage = reply.whole()  # the marker was found elsewhere too: the whole message
        else:
            if isinstance(prev, _Reply):  # content that is not text now: merged whole from here on
                prev = prev.whole()
            current = prev + message if isinstance(prev, BaseMessageChunk) else message
            self._seen[msg_id] = current
        return self._partials.encode(msg_id, _listed(message_chunk_to_message(current)))


def _fields(message: BaseMessageChunk) -> _Fields:
    fields = dict(message.__dict__)
    del fields["content"]
    return type(message), fields, message.__pydantic_extra__


def _same(a: BaseMessageChunk, b: BaseMessageChunk) -> bool:
    """Whether two merged chunks hold the same values (their fields and extra fields)."""
    return type(a) is type(b) and a.__dict__ == b.__dict__ and a.__pydantic_extra__ == b.__pydantic_extra__


def _listed(message: BaseMessage) -> bytes:
    """`dumps([message])`, the message written by pydantic-core (`model_json`)."""
    return b"[" + model_json(message) + b"]"


_CONTENT_KEY = b'{"content":'
_TEXT_START = len(_CONTENT_KEY)
#: What a `messages-tuple` frame `[message, metadata]` holds before a message's text (`_content_end`).
_TUPLE_HEAD = b"[" + _CONTENT_KEY


def _content_end(body: bytes, message: Any) -> int:
    """Where a message's text content ends in its JSON `body` (which opens with the content, as a message's
    fields are ordered), the part of a chunk's tuple frame that changes from one chunk to the next; 0 when the
    content is not text or not found there."""
    content = getattr(message, "content", None)
    if not isinstance(content, str):
        return 0
    text = dumps(content)
    if not (body.startswith(_CONTENT_KEY) and body.startswith(text, _TEXT_START)):
        return 0
    return _TEXT_START + len(text)
