"""What the server holds for streams: `messages/partial` frames held as deltas (byte for byte the frames
clients got before, however they join), bytes linear in the reply, and a partial never rebuilt wrong when the
bounded buffer dropped what it builds on. On SQLite (memory broker) and PostgreSQL + Redis.

The tests over the API share one started app per backend, each on threads of its own (`tests/shared_app.py`);
the one with a smaller stream buffer starts its own app on `own_backend`."""

from __future__ import annotations

import ctypes
import json
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from tests.conftest import PROJECT
from tests.services import Backend
from tests.shared_app import shared_app
from threadline.api.app import create_app
from threadline.broker.memory import MemoryBroker
from threadline.core.partials import DELTA, KEYFRAME, PartialDecoder, PartialEncoder, is_partial
from threadline.core.runtime import Runtime
from threadline.settings import Settings

#: The frames of `talker` streams, as Threadline sent them before partials were held as deltas (ids,
#: UUIDs and library versions normalized).
EXPECTED = json.loads((Path(__file__).parent / "project" / "talker_frames.json").read_text())
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ID = re.compile(rb"^id: .*$", re.M)
_VERSIONS = re.compile(rb'"lc_versions":\{[^}]*\}')

Frame = tuple[str, str, bytes]  # (id, event, data)


def _normalized(body: bytes) -> str:
    seen: dict[bytes, bytes] = {}
    body = _UUID.sub(lambda m: seen.setdefault(m.group(0), b"<uuid%d>" % len(seen)), body)
    return _sorted_metadata(_VERSIONS.sub(b'"lc_versions":<versions>', _ID.sub(b"id: <id>", body)).decode())


def _sorted_metadata(text: str) -> str:
    """Run metadata with sorted keys: the order of an assistant's metadata keys is the database's (PostgreSQL's
    jsonb sorts them), not the stream's. So `messages/metadata` data is sorted, and the metadata of each
    `messages` tuple; the rest (the chunk of a tuple, every other frame) is compared byte for byte."""
    lines = text.split("\n")
    for i, line in enumerate(lines[1:], 1):
        event, data = lines[i - 1], line[6:].rstrip("\r").replace(":<versions>", ':"<versions>"')
        if not line.startswith("data: "):
            continue
        if event.startswith("event: messages/metadata"):
            lines[i] = "data: " + json.dumps(json.loads(data), sort_keys=True) + "\r"
        elif event.startswith("event: messages") and "/" not in event:
            _, end = json.JSONDecoder().raw_decode(data, 1)  # the chunk, kept as sent
            metadata = json.loads(data[end + 1:-1])
            lines[i] = "data: " + data[:end + 1] + json.dumps(metadata, sort_keys=True) + "]\r"
    return "\n".join(lines)


def _frames(raw: bytes) -> list[Frame]:
    out = []
    for block in raw.split(b"\r\n\r\n")[:-1]:
        fields = dict(line.partition(b": ")[::2] for line in block.split(b"\r\n") if not line.startswith(b":"))
        if b"event" in fields:
            out.append((fields.get(b"id", b"").decode(), fields[b"event"].decode(), fields.get(b"data", b"")))
    return out


def _settings(backend: Backend, **more: Any) -> Settings:
    return Settings(config=str(PROJECT), workers=4, heartbeat_seconds=5.0, **backend.settings(), **more)


pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the mark above reaches the module's plain functions too, which run as such
              pytest.mark.filterwarnings("ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async")]
backend, served, http, live_url = shared_app(live_url=True)


@pytest.fixture
async def client(app: object, runtime: Runtime) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",  # type: ignore[arg-type]
                                 timeout=60) as http:
        yield http, runtime


async def _talk(http: httpx.AsyncClient, words: int, **body: Any) -> tuple[str, str, bytes]:
    """(thread id, run id, raw SSE body) of a `talker` run streamed to its end."""
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    raw = (await http.post(f"/threads/{tid}/runs/stream", json={
        "assistant_id": "talker", "input": {"words": words}, "stream_resumable": True, **body})).content
    return tid, json.loads(_frames(raw)[0][2])["run_id"], raw


# The held form, on its own.


def test_partials_round_trip_byte_for_byte() -> None:
    rng = random.Random(7)
    encoder, decoder = PartialEncoder(), PartialDecoder()
    content, usage = {"a": b"", "b": b""}, {"a": 0, "b": 0}
    for _ in range(400):
        msg = rng.choice("ab")
        content[msg] += rng.choice([b"x", b" ", b"\xc3\xa9", b"yz" * rng.randint(1, 30)])
        usage[msg] += rng.random() < 0.2  # now and then a change further on, too
        frame = b'[{"content":"%b","usage":%d,"id":"%b"}]' % (content[msg], usage[msg], msg.encode())
        held = encoder.encode(msg, frame)
        assert is_partial(held)
        assert decoder.decode(held) == frame
    assert not decoder.gap


def test_partials_with_a_span_round_trip_byte_for_byte() -> None:
    """A frame given with the span where it is expected to change (a chunk's text) is encoded against the
    previous frame's span when the bytes around both are the same, and whole otherwise (a change further on)."""
    rng = random.Random(11)
    encoder, decoder = PartialEncoder(), PartialDecoder()
    usage = 0
    for _ in range(400):
        text = rng.choice([b"", b"x", b" ", b"\xc3\xa9", b"yz" * rng.randint(1, 30), b"xyz"])
        usage += rng.random() < 0.2
        head, tail = b'[{"content":"', b'","usage":%d,"id":"m"},{"meta":1}]' % usage
        frame = head + text + tail
        held = encoder.encode("m", frame, (len(head) - 1, len(head) + len(text) + 1))
        assert decoder.decode(held) == frame
    assert not decoder.gap


def test_frames_around_a_middle_round_trip_byte_for_byte_among_other_frames() -> None:
    """`encode_around` (a frame expected to differ from the last in its middle) holds the middle alone when
    the message's last frame had the same head and tail, and whole otherwise: also when the frames before it
    came from `encode` (whole) or `encode_parts` (a growing body), whose bytes around it are not its own."""
    rng = random.Random(5)
    encoder, decoder = PartialEncoder(), PartialDecoder()
    head, body, around = b'[{"content":', bytearray(), 0
    tails = [b',"id":"m"},{"meta":1}]', b',"id":"m"},{"meta":2}]', b'}]']
    for i in range(2_000):
        kind = rng.choice(["around", "around", "around", "whole", "parts"])
        if kind == "around":
            middle = b'"%b"' % rng.choice([b"", b"x", b" ", b"\xc3\xa9", b"yz" * rng.randint(1, 30)])
            tail = rng.choice(tails[:2]) if rng.random() < 0.2 else tails[0]
            frame, held = head + middle + tail, encoder.encode_around("m", head, middle, tail)
            around += held[:1] == DELTA and held.endswith(b"\n" + middle)
        elif kind == "whole":  # another frame of the message around another middle, or with the same tail
            frame = head + b'"whole %d"' % i + rng.choice(tails)
            held = encoder.encode("m", frame)
        else:
            grown = rng.choice([b"p", b"qq"])
            body += grown
            frame = b'[{"content":"' + body + b'"}]'
            held = encoder.encode_parts("m", b'[{"content":"', body, b'"}]', len(grown))
        assert decoder.decode(held) == frame, (i, kind)
    assert not decoder.gap
    assert around > 300, around  # most frames around a middle, after one of their own, held as the middle


def test_the_encoder_keeps_the_last_frames_of_as_many_messages_as_a_subscriber() -> None:
    """A run of many messages (a long agent) holds the last frame of the newest `MAX_MESSAGES` only; a later
    frame of an older message is held whole, and every frame still rebuilds byte for byte."""
    from threadline.core.partials import MAX_MESSAGES

    encoder, decoder = PartialEncoder(), PartialDecoder()
    for m in range(3 * MAX_MESSAGES):
        for n in range(3):
            frame = b'[{"content":"message %d, frame %d"}]' % (m, n)
            assert decoder.decode(encoder.encode(f"m{m}", frame)) == frame
    assert len(encoder._last) == MAX_MESSAGES
    late = b'[{"content":"message 0, late"}]'
    held = encoder.encode("m0", late)
    assert held[:1] == KEYFRAME and decoder.decode(held) == late
    assert not decoder.gap


def test_tuple_frames_are_the_chunk_and_its_metadata_byte_for_byte() -> None:
    from threadline.core.messages import MessageStreamer
    from threadline.serde import dumps

    streamer, decoder = MessageStreamer(legacy=False, tuples=True), PartialDecoder()
    metadata = {"langgraph_node": "model", "ls_provider": "fake", "tags": ["a"]}
    for i, chunk in enumerate(_reply(300)):
        [(event, held)] = list(streamer.feed((chunk, metadata)))
        assert event == "messages"
        assert decoder.decode(held) == b"[" + dumps(chunk) + b"," + dumps(metadata) + b"]", i
    assert not decoder.gap


def test_a_delta_without_the_partial_before_it_is_not_rebuilt() -> None:
    encoder, decoder = PartialEncoder(), PartialDecoder()
    held = [encoder.encode("m", b"[" + b"x" * n + b"]") for n in range(100, 105)]  # a keyframe, then deltas
    assert decoder.decode(held[0]) == b"[" + b"x" * 100 + b"]"
    assert decoder.decode(held[2]) is None and decoder.gap  # held[1] is missing
    assert decoder.decode(held[3]) is None  # nor anything after it until a keyframe
    late = [decoder.decode(encoder.encode("m", b"[" + b"x" * n + b"]")) for n in range(105, 110)]
    assert late[0] is None and late[-1] == b"[" + b"x" * 109 + b"]"  # the deltas outweighed it: a keyframe


def _reply(n: int) -> list[Any]:
    """The chunks of a streamed reply of `n` chunks, as a provider sends them: text of every kind (escapes,
    non-ASCII, quotes), metadata on the first and last chunks, usage on the last, a tool call streamed late."""
    from langchain_core.messages import AIMessageChunk

    texts = ["word", " ", "é", '"quoted"', "line\n", "\u2028", "tab\t", "\\", "\x01", "🙂", "<b>"]
    chunks = [AIMessageChunk(content=texts[i % len(texts)], id="run-m1") for i in range(n - 2)]
    chunks.insert(0, AIMessageChunk(content="", id="run-m1", response_metadata={"model_name": "fake"}))
    chunks.append(AIMessageChunk(content=".", id="run-m1", tool_call_chunks=[
        {"name": "search", "args": '{"q": 1}', "id": "call-1", "index": 0}],
        usage_metadata={"input_tokens": 3, "output_tokens": n, "total_tokens": n + 3},
        response_metadata={"finish_reason": "stop"}, chunk_position="last"))
    return chunks


def test_messages_partials_are_the_whole_message_so_far_at_a_flat_cost_per_chunk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each `messages/partial` frame is the whole message so far, serialized whole (as before: the reference
    below merges the chunks and serializes the message for each), while what the executor serializes per
    chunk does not grow with the reply (before, it was the message so far: 4 times as much at 4x the chunks)."""
    from langchain_core.messages import message_chunk_to_message

    from threadline.core import messages
    from threadline.serde import dumps

    serialized = [0]

    def counting(obj: Any) -> bytes:
        out = dumps(obj)
        serialized[0] += len(out)
        return out

    monkeypatch.setattr(messages, "dumps", counting)
    per_chunk = {}
    for n in (1_000, 4_000):
        streamer, decoder, merged = messages.MessageStreamer(legacy=True, tuples=False), PartialDecoder(), None
        serialized[0] = 0
        for i, chunk in enumerate(_reply(n)):
            events = dict(streamer.feed((chunk, {"langgraph_node": "model"})))
            if n == 1_000:  # the frames against the reference (quadratic itself, so at the smaller size)
                merged = chunk if merged is None else merged + chunk
                assert decoder.decode(events["messages/partial"]) == dumps([message_chunk_to_message(merged)]), i
        per_chunk[n] = serialized[0] / n
    assert per_chunk[4_000] < 1.25 * per_chunk[1_000], per_chunk


def _varied_reply() -> list[Any]:
    """Chunks whose fields besides the text change along the reply, in stretches and alone: fields whose merge
    is a no-op (zero usage, the same provider), and fields whose merge is not (a string in `additional_kwargs`
    or `response_metadata` grows by itself, usage adds up, a tool call's arguments grow). (All of a message's
    chunks have its id: the stream tells messages apart by it.)"""
    from langchain_core.messages import AIMessageChunk

    texts = ["a", " ", "é", '"q"', "\n", "🙂", "\u2028"]
    zero = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    kinds: list[dict[str, Any]] = [
        {"id": "lc_run--1"}, {"id": "lc_run--1", "name": "bot"},
        {"id": "lc_run--1", "response_metadata": {"model_provider": "openai"}},
        {"id": "lc_run--1", "usage_metadata": zero},
        {"id": "lc_run--1", "usage_metadata": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}},
        {"id": "lc_run--1", "additional_kwargs": {"note": "x"}},
        {"id": "lc_run--1", "tool_call_chunks": [{"name": "f", "args": "{", "id": "c1", "index": 0}]},
        {"id": "lc_run--1", "response_metadata": {"finish_reason": "stop"}, "chunk_position": "last"}]
    rng = random.Random(7)
    chunks: list[AIMessageChunk] = []
    while len(chunks) < 600:
        kind = rng.choice(kinds)
        for _ in range(rng.choice([1, 1, 2, 5, 20])):  # alone, or a stretch of chunks alike
            chunks.append(AIMessageChunk(content=rng.choice(texts), **kind))
    # A merge that changes a field the frame does not show (a tool call's arguments, by spaces: the call the
    # frame shows, parsed, is the same) is not a no-op: the arguments the frame shows later hold every space.
    chunks.append(AIMessageChunk(content="t", id="lc_run--1", tool_call_chunks=[
        {"name": "g", "args": '{"q": 1}', "id": "c2", "index": 1}]))
    for args in [" ", " ", " ", " ", "}"]:  # (then invalid: the frame shows the arguments as they came)
        chunks.append(AIMessageChunk(content="t", id="lc_run--1", tool_call_chunks=[
            {"name": None, "args": args, "id": None, "index": 1}]))
    return chunks


def test_messages_partials_of_chunks_whose_other_fields_change_are_the_merged_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk's merge is skipped when a chunk with the same fields merged as a no-op just before (most chunks
    of a reply: text alone): the frames are still the merged message byte for byte when the other fields
    change, in stretches or chunk by chunk, whether their merge changes the message or not."""
    from langchain_core.messages import message_chunk_to_message

    from threadline.core import messages
    from threadline.serde import dumps

    cut = [0]

    def counting(chunk: Any) -> Any:
        cut[0] += 1
        return message_chunk_to_message(chunk)

    monkeypatch.setattr(messages, "message_chunk_to_message", counting)
    streamer, decoder, merged = messages.MessageStreamer(legacy=True, tuples=False), PartialDecoder(), None
    chunks = _varied_reply()
    for i, chunk in enumerate(chunks):
        events = dict(streamer.feed((chunk, {"langgraph_node": "model"})))
        merged = chunk if merged is None else merged + chunk
        assert decoder.decode(events["messages/partial"]) == dumps([message_chunk_to_message(merged)]), i
    assert not decoder.gap
    assert 0 < cut[0] < len(chunks) - 100, cut  # the stretches of no-op merges were skipped
    # A reply of text alone (the fields of its first and last chunks aside): all but a few chunks skipped.
    streamer, cut[0] = messages.MessageStreamer(legacy=True, tuples=False), 0
    for chunk in _reply(300):
        list(streamer.feed((chunk, {"langgraph_node": "model"})))
    assert cut[0] <= 4, cut


def test_tuple_and_partial_frames_of_one_message_interleaved_round_trip_byte_for_byte() -> None:
    """Both shapes on one run (`stream_mode: ["messages-tuple", "messages"]`) encode each chunk's two frames
    against the same message's last frame, one after the other: a tuple frame held as its text alone, a
    partial held in parts or whole (content that is not text: a list of parts), and every frame rebuilds
    byte for byte, whichever shape came before it; so do the tuple frames alone, where a chunk whose content
    is a list (held whole) comes between text chunks with the same other fields."""
    from langchain_core.messages import AIMessageChunk, message_chunk_to_message

    from threadline.core.messages import MessageStreamer
    from threadline.serde import dumps

    # Text between chunks whose content is a list of parts, the other fields the same throughout.
    texts = [AIMessageChunk(content=t, id="lc_run--2") for t in ("a", " ", "b", "é", " ")]
    parts = [AIMessageChunk(content=[{"type": "text", "text": t, "index": 0}], id="lc_run--2") for t in "xy"]
    chunks = _reply(40) + _varied_reply()[:200] + texts + parts[:1] + texts + parts + texts
    metadata = {"langgraph_node": "model"}
    for legacy in (True, False):
        streamer, decoder = MessageStreamer(legacy=legacy, tuples=True), PartialDecoder()
        merged: dict[str, Any] = {}
        for i, chunk in enumerate(chunks):
            events = dict(streamer.feed((chunk, metadata)))
            assert decoder.decode(events["messages"]) == b"[" + dumps(chunk) + b"," + dumps(metadata) + b"]", i
            if legacy:
                merged[chunk.id] = chunk if chunk.id not in merged else merged[chunk.id] + chunk
                assert decoder.decode(events["messages/partial"]) == dumps(
                    [message_chunk_to_message(merged[chunk.id])]), i
        assert not decoder.gap


def test_a_tuple_frame_is_held_as_its_chunks_text() -> None:
    """Between keyframes, a `messages-tuple` event is held as the chunk's JSON text and a short header: not
    the chunk's other fields or the metadata, which every frame of the message repeats."""
    from threadline.core.messages import MessageStreamer
    from threadline.serde import dumps

    streamer = MessageStreamer(legacy=False, tuples=True)
    metadata = {"langgraph_node": "model", "checkpoint_ns": "model:" + "0" * 36, "ls_provider": "fake"}
    sizes = []
    for chunk in _reply(2_000)[1:-1]:  # the text chunks
        [(_, held)] = list(streamer.feed((chunk, metadata)))
        sizes.append((len(held), len(dumps(chunk.content))))
    deltas = [size - text for size, text in sizes if size - text < 40]
    assert len(deltas) > 0.9 * len(sizes), (len(deltas), len(sizes))


# Over the API.


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_messages_frames_are_byte_identical_to_before(client: tuple[httpx.AsyncClient, Runtime],
                                                            name: str) -> None:
    http, _ = client
    bodies: dict[str, dict[str, Any]] = {
        "messages": {"stream_mode": ["messages"]}, "messages_values": {"stream_mode": ["messages", "values"]},
        "messages_subgraphs": {"stream_mode": ["messages"], "stream_subgraphs": True},
        "messages_tuple": {"stream_mode": ["messages-tuple"]},
        "messages_tuple_values": {"stream_mode": ["messages-tuple", "values"], "stream_subgraphs": True}}
    body = bodies[name]
    _, _, raw = await _talk(http, 6, **body)
    assert _normalized(raw) == _sorted_metadata(EXPECTED[name])


@pytest.mark.parametrize("mode", ["messages", "messages-tuple"])
async def test_resumes_and_filtered_joins_rebuild_the_same_frames(client: tuple[httpx.AsyncClient, Runtime],
                                                                  mode: str) -> None:
    http, _ = client
    tid, run_id, raw = await _talk(http, 40, stream_mode=[mode, "values"])
    full = _frames(raw)
    path = f"/threads/{tid}/runs/{run_id}/stream"
    partials = [i for i, f in enumerate(full) if f[1] in ("messages/partial", "messages")]
    assert len(partials) > 100
    # Resumes from anywhere (inside a message, right after its first partial, between messages) get exactly
    # the frames that came after, each partial rebuilt byte for byte.
    for k in (0, partials[0], partials[1], partials[37], partials[len(partials) // 2], partials[-1] - 1, len(full) - 2):
        got = _frames((await http.get(path, headers={"Last-Event-ID": full[k][0]})).content)
        assert got == full[k + 1:], k
    # A join for `messages` only (a resume, filtered): the same partials, without the values.
    got = _frames((await http.get(path, params={"stream_mode": "messages"},
                                  headers={"Last-Event-ID": full[partials[60]][0]})).content)
    assert got == [f for f in full[partials[60] + 1:] if f[1].split("/")[0] == "messages"]


async def test_a_live_join_and_the_thread_stream_rebuild_the_same_frames(live_url: str) -> None:
    async with httpx.AsyncClient(base_url=live_url, timeout=60) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        run = (await http.post(f"/threads/{tid}/runs", json={
            "assistant_id": "talker", "input": {"words": 60, "delay": 0.005}, "stream_mode": ["messages"]})).json()
        joined: list[Frame] = []
        async with http.stream("GET", f"/threads/{tid}/runs/{run['run_id']}/stream") as response:
            buffer = b""
            async for chunk in response.aiter_raw():
                buffer += chunk
        joined = _frames(buffer)
        everything = _frames((await http.get(f"/threads/{tid}/runs/{run['run_id']}/stream",
                                             headers={"Last-Event-ID": "-1"})).content)
        assert joined and joined[-1] == everything[-1]
        start = [f[0] for f in everything].index(joined[0][0])
        assert joined == everything[start:]
        # The thread's stream, resumed inside the run: the same frames, ids prefixed with the run's.
        k = [i for i, f in enumerate(everything) if f[1] == "messages/partial"][50]
        got: list[Frame] = []
        async with http.stream("GET", f"/threads/{tid}/stream",
                               headers={"Last-Event-ID": f"{run['run_id']}/{everything[k][0]}"}) as response:
            buffer = b""
            async for chunk in response.aiter_raw():
                buffer += chunk
                got = _frames(buffer)
                if got and got[-1][0].endswith("/done"):
                    break
        assert got[:-1] == [(f"{run['run_id']}/{i}", e, d) for i, e, d in everything[k + 1:]]


async def test_held_bytes_grow_linearly_with_the_reply(client: tuple[httpx.AsyncClient, Runtime]) -> None:
    """Before, a reply of 4n tokens held about 16 times the bytes of one of n in `messages` mode."""
    http, runtime = client
    held = {}
    for words in (100, 400):
        _, run_id, _ = await _talk(http, words, stream_mode=["messages"])
        held[words] = await runtime.broker.buffered_bytes(run_id)
    assert held[400] < 5 * held[100], held


async def test_a_partial_is_never_rebuilt_from_what_was_dropped(own_backend: Backend) -> None:
    """A buffer of 30 KB for a reply of 300 words: the live stream may fall behind what is kept, and a resume
    from the start certainly does. Either gets only partials rebuilt right, and the replay gap is counted."""
    app = create_app(_settings(own_backend, stream_buffer_bytes=30_000))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://t",
                                     timeout=60) as http:
            tid, run_id, raw = await _talk(http, 300, stream_mode=["messages"])
            first = _frames(raw)
            assert await app.state.runtime.broker.buffered_bytes(run_id) <= 30_000
            resumed = _frames((await http.get(f"/threads/{tid}/runs/{run_id}/stream",
                                              headers={"Last-Event-ID": first[0][0]})).content)
            metrics = (await http.get("/metrics")).text
    replies = {f"w{r}": " ".join(f"w{r}.{i}" for i in range(300)) for r in (0, 1)}
    for _, event, data in first + resumed:
        if event == "messages/partial":
            content = json.loads(data)[0]["content"]
            assert replies[content.split(".")[0]].startswith(content), content
    sent_first = dict((i, (e, d)) for i, e, d in first)
    assert all(sent_first[i] == (e, d) for i, e, d in resumed if i in sent_first)
    assert len(resumed) < len(first) and json.loads(resumed[-1][2])[0]["content"] == replies["w1"]
    assert re.search(r"^lg_api_stream_replay_gaps_total [12]\.0$", metrics, re.M)


def _allocated(data: bytes) -> int:
    """What glibc handed out for a `bytes` object (one over 512 bytes: Python takes it from `malloc`)."""
    usable = ctypes.CDLL(None).malloc_usable_size
    usable.argtypes, usable.restype = [ctypes.c_void_p], ctypes.c_size_t
    return int(usable(id(data)))


async def test_the_events_a_run_posts_take_their_own_length(client: tuple[httpx.AsyncClient, Runtime],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream's events are held (the memory broker's buffer, a Redis outbox) by their length, which the byte
    budgets count: not in orjson's output buffer, which held about twice a large event's length (a server
    holding 193 MB of counted events grew by 390 MB)."""
    http, runtime = client
    posted: list[bytes] = []
    post = runtime.broker.post

    async def recording(run_id: str, event: str, data: bytes) -> None:
        posted.append(data)
        await post(run_id, event, data)

    monkeypatch.setattr(runtime.broker, "post", recording)
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    answer = await http.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": "echo", "input": {"messages": [{"role": "user", "content": "x" * 200_000}]}})
    assert answer.status_code == 200, answer.text
    large = [data for data in posted if len(data) > 100_000]
    assert len(large) >= 2  # the values before and after the reply
    for data in large:
        assert _allocated(data) < len(data) + 8192, (len(data), _allocated(data))


async def test_finished_runs_keep_no_more_than_their_budget_in_a_served_process(own_backend: Backend) -> None:
    """`stream_finished_bytes` reaches the process's broker: turns on a thread whose state each run posts twice
    (as `values`) keep the newest finished runs' events within it, and a resume of an older run's stream gets the
    counted gap instead of its events."""
    app = create_app(_settings(own_backend, stream_finished_bytes=30_000))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        broker = app.state.runtime.broker
        if not isinstance(broker, MemoryBroker):
            pytest.skip("a shared broker keeps the events in its service (bounded by stream_memory_bytes)")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://t",
                                     timeout=60) as http:
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            runs = []
            for i in range(3):  # the state twice per run, growing by 4 KB a run: about 6, 14 and 22 KB of events
                answer = await http.post(f"/threads/{tid}/runs", json={
                    "assistant_id": "echo", "input": {"messages": [{"role": "user", "content": f"{i}" * 2_000}]}})
                runs.append(answer.json()["run_id"])
                await http.get(f"/threads/{tid}/runs/{runs[-1]}/join")
            # Read to its end: the last run's stream has ended, and its reader is gone.
            last = _frames((await http.get(f"/threads/{tid}/runs/{runs[-1]}/stream",
                                           headers={"Last-Event-ID": "-1"})).content)
            assert 0 < broker.finished_bytes <= 30_000
            first = _frames((await http.get(f"/threads/{tid}/runs/{runs[0]}/stream",
                                            headers={"Last-Event-ID": "-1"})).content)
            metrics = (await http.get("/metrics")).text
    assert [event for _, event, _ in first] == []
    assert [event for _, event, _ in last].count("values") == 2
    assert re.search(r"^lg_api_stream_replay_gaps_total 1\.0$", metrics, re.M)
