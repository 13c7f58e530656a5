"""Message events held as deltas, rebuilt into whole frames for each subscriber.

LangGraph's `messages` mode sends, for each chunk a model streams, the whole message so far: the frames of a
reply of n tokens weigh O(n²). A stream buffer holding them grows with the square of the reply. Instead the
executor posts each partial as the bytes that changed since the previous partial of the same message (a
*delta*: the common prefix and suffix kept, the middle replaced), and now and then whole (a *keyframe*: the
first partial of a message, and the next one once the deltas since the last keyframe weigh as much as the
frame: keyframes then weigh no more than the deltas, and the newest 2 frames' worth of a message's events
always hold one to rebuild from). The buffer holds bytes linear in the reply; each subscriber rebuilds the
frames as it sends them, byte for byte those the executor encoded. `messages-tuple` events are held the same
way: each `[chunk, metadata]` frame differs from the previous one of its message by the chunk's text only,
and the metadata it repeats is most of its bytes.

A rebuilt frame needs the partial before it. A subscriber that joins or resumes mid-stream first reads the
run's buffered events before its cursor (`Broker.subscribe(context=True)`) without sending them. When a
partial it needs was dropped from the bounded buffer, the deltas of that message are not sent (never a
wrong partial) until the next keyframe, and the stream counts as a replay gap.

Held events start with a marker byte JSON never starts with: `\\x01` keyframe, `\\x00` delta, then a
JSON header line (`[key, n]`, `[key, n, prefix, suffix]`: `key` numbers the run's messages, `n` the message's
frames), then the bytes. Encoded here and decoded here; no other module reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from threadline.serde import dumps, loads

KEYFRAME = b"\x01"
DELTA = b"\x00"
#: A subscriber keeps the last frame of this many messages at most (the newest), to rebuild the next.
MAX_MESSAGES = 64


class Held(bytes):
    """Event data already in its held form (the executor posts it as it is, not JSON-encoded again)."""


def is_partial(data: bytes) -> bool:
    """Whether a held event's data is an encoded partial (to be rebuilt before it is sent)."""
    return data[:1] in (KEYFRAME, DELTA)


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix (a binary search of `startswith`: C speed, no copies)."""
    view, lo, hi = memoryview(a), 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(view[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    view, lo, hi = memoryview(a), 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.endswith(view[len(a) - mid:]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _same_around(a: bytes, a_span: tuple[int, int], b: bytes, b_span: tuple[int, int]) -> bool:
    """Whether `a` and `b` are the same bytes before and after their spans (which start at the same place)."""
    start = a_span[0]
    return start == b_span[0] and a[:start] == b[:start] and len(a) - a_span[1] == len(b) - b_span[1] \
        and a[a_span[1]:] == b[b_span[1]:]


@dataclass
class _Sent:
    frame: bytes | None  # the last frame whole; None while it is only held in parts (built when needed)
    n: int  # how many partials of this message came before, this one included
    deltas: int = 0  # bytes of the deltas since the last keyframe
    # The last frame in parts (`encode_parts`): head + body[:body_len] + tail; `body` only ever grows.
    head: bytes = b""
    body: bytearray | None = None
    body_len: int = 0
    tail: bytes = b""
    # Where the last frame may differ from the one before it (`encode(span=...)`), None when not known.
    span: tuple[int, int] | None = None
    # The last frame around its middle (`encode_around`): head + middle + tail, `body` None.
    middle: bytes = b""

    def whole(self) -> bytes:
        if self.frame is None:
            if self.body is None:
                self.frame = self.head + self.middle + self.tail
            else:
                self.frame = self.head + self.body[:self.body_len] + self.tail
        return self.frame


class PartialEncoder:
    """The executor's side: each message's last partial frame, to encode the next one against it; of the
    `MAX_MESSAGES` messages begun last at most (a subscriber rebuilds no more: a later frame of an older one is
    a keyframe again), so a run of many messages holds a bounded number of frames."""

    def __init__(self) -> None:
        self._last: dict[str, _Sent] = {}
        self._keys: dict[str, int] = {}  # msg_id → its short key in the headers

    def encode(self, msg_id: str, frame: bytes, span: tuple[int, int] | None = None) -> Held:
        """The held form of `frame`, the next frame of message `msg_id`. `span`: where in `frame` it is expected
        to differ from the frame before it (a chunk's text); when that frame's bytes around its own span are
        the same, only the two spans are compared (else the whole frames are)."""
        key = self._keys.setdefault(msg_id, len(self._keys))
        last = self._last.get(msg_id)
        if last is None or last.deltas >= len(frame):
            n = 0 if last is None else last.n + 1
            if last is None and len(self._last) >= MAX_MESSAGES:  # as a subscriber keeps: the oldest goes
                del self._last[next(iter(self._last))]
            self._last[msg_id] = _Sent(frame, n, span=span)
            return Held(KEYFRAME + dumps([key, n]) + b"\n" + frame)
        before = last.whole()
        if span is not None and last.span is not None and _same_around(before, last.span, frame, span):
            start, end = span
            old, new = before[start:last.span[1]], frame[start:end]
            inner = _common_prefix(old, new)
            prefix = start + inner
            suffix = len(frame) - end + _common_suffix(old, new, min(len(old), len(new)) - inner)
        else:
            prefix = _common_prefix(before, frame)
            suffix = _common_suffix(before, frame, min(len(before), len(frame)) - prefix)
        last.n += 1
        middle = frame[prefix:len(frame) - suffix]
        head = dumps([key, last.n, prefix, suffix])
        last.frame, last.body, last.span = frame, None, span
        last.head = last.middle = last.tail = b""  # the frame is whole: no part of an earlier frame stays
        held = Held(DELTA + head + b"\n" + middle)
        last.deltas += len(held)
        return held

    def encode_around(self, msg_id: str, head: bytes, middle: bytes, tail: bytes) -> Held:
        """The held form of the frame `head + middle + tail`, expected to differ from the message's previous
        frame in its `middle` only (a `messages-tuple` frame: the chunk's text between the same head and tail).
        When the previous frame had the same head and tail, the delta is `middle`, found without building the
        frame or comparing more than the two tails (in C); else the whole frame is encoded as by `encode`."""
        last = self._last.get(msg_id)
        size = len(head) + len(middle) + len(tail)
        if last is None or last.body is not None or last.head != head or last.tail != tail or last.deltas >= size:
            held = self.encode(msg_id, head + middle + tail, (len(head), len(head) + len(middle)))
        else:
            last.n += 1
            held = Held(DELTA + dumps([self._keys[msg_id], last.n, len(head), len(tail)]) + b"\n" + middle)
            last.deltas += len(held)
            last.frame, last.span = None, (len(head), len(head) + len(middle))
        sent = self._last[msg_id]
        sent.head, sent.middle, sent.tail = head, middle, tail
        return held

    def encode_parts(self, msg_id: str, head: bytes, body: bytearray, tail: bytes, grown: int) -> Held:
        """The held form of the frame `head + body + tail`, whose `body` (a message's text, JSON-escaped) grew
        by its last `grown` bytes since the message's previous frame. When that frame had the same head and
        tail, the delta is those bytes, found without comparing or building the frame: a partial costs the
        size of its chunk, not of the message so far (only a keyframe, now and then, builds the frame)."""
        last = self._last.get(msg_id)
        size = len(head) + len(body) + len(tail)
        if (last is None or last.body is not body or last.body_len != len(body) - grown or last.head != head
                or last.tail != tail or last.deltas >= size):
            held = self.encode(msg_id, head + body + tail)
        else:
            last.n += 1
            held = Held(DELTA + dumps([self._keys[msg_id], last.n, len(head) + last.body_len, len(tail)]) + b"\n"
                        + body[last.body_len:])
            last.deltas += len(held)
            last.frame = None
        sent = self._last[msg_id]
        sent.head, sent.body, sent.body_len, sent.tail = head, body, len(body), tail
        return held

    def forget(self, msg_id: str) -> None:
        """The message was sent whole (`messages/complete`): a later partial of it starts again."""
        self._last.pop(msg_id, None)


@dataclass
class PartialDecoder:
    """A subscriber's side: rebuilds each held partial into the frame the executor encoded."""

    frames: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # message key → (n, frame)
    #: Whether a partial could not be rebuilt (one it builds on was dropped from the buffer).
    gap: bool = False

    def decode(self, data: bytes) -> bytes | None:
        """The whole frame of a held partial, or None when the partial it builds on is missing."""
        marker, rest = data[:1], data[1:]
        head_end = rest.index(b"\n")
        head, body = loads(rest[:head_end]), rest[head_end + 1:]
        msg_id, n = head[0], head[1]
        if marker == KEYFRAME:
            frame = bytes(body)
        else:
            known = self.frames.get(msg_id)
            if known is None or known[0] != n - 1:
                self.frames.pop(msg_id, None)
                self.gap = True
                return None
            base, prefix, suffix = known[1], head[2], head[3]
            frame = base[:prefix] + body + base[len(base) - suffix:]
        self.frames.pop(msg_id, None)  # re-inserted last: the dict's order is the messages' recency
        self.frames[msg_id] = (n, frame)
        if len(self.frames) > MAX_MESSAGES:
            self.frames.pop(next(iter(self.frames)))
        return frame
