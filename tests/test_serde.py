"""How LangGraph values become JSON: messages as LangGraph's server shows them, whatever they carry."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import gc
import tracemalloc
import uuid
from collections.abc import Callable

from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langgraph.types import Interrupt

from threadline.serde import dumps, dumps_kept, loads, model_json, to_jsonable


@dataclasses.dataclass
class Point:
    x: int


class Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


def test_a_message_is_its_fields() -> None:
    message = AIMessage(content="hello", id="m1", tool_calls=[{"name": "search", "args": {"q": "x"}, "id": "c1"}])
    shown = to_jsonable(message)
    assert shown == loads(dumps(message))
    assert shown["type"] == "ai" and shown["content"] == "hello" and shown["id"] == "m1"
    assert shown["tool_calls"] == [{"name": "search", "args": {"q": "x"}, "id": "c1", "type": "tool_call"}]
    assert to_jsonable(HumanMessage(content="hi"))["type"] == "human"


def test_what_a_message_carries_is_made_json_too() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    token = uuid.UUID("12345678-1234-5678-1234-567812345678")
    message = AIMessage(content="x", response_metadata={
        "when": when, "id": token, "point": Point(3), "opaque": Opaque(), "raw": b"bytes", "nan": float("nan"),
        "tuple": (1, 2)})
    meta = loads(dumps(message))["response_metadata"]
    assert dt.datetime.fromisoformat(meta["when"].replace("Z", "+00:00")) == when
    assert meta["id"] == str(token)
    assert meta["point"] == {"x": 3}
    assert meta["opaque"] == "<opaque>"
    assert meta["raw"] == "bytes"
    assert meta["nan"] is None
    assert meta["tuple"] == [1, 2]
    assert to_jsonable(message)["response_metadata"]["point"] == {"x": 3}


def test_values_around_messages() -> None:
    value = {"messages": [HumanMessage(content="hi", id="h")], "interrupt": Interrupt(value={"ask": "name?"}, id="i"),
             "at": dt.date(2026, 1, 2), "set": {1}}
    shown = to_jsonable(value)
    assert shown["messages"][0]["content"] == "hi"
    assert shown["interrupt"]["value"] == {"ask": "name?"} and shown["interrupt"]["id"] == "i"
    assert shown["at"] == "2026-01-02" and shown["set"] == [1]


def test_a_model_whose_json_mode_fails_is_converted_from_its_python_dump() -> None:
    import pydantic

    class Picky(pydantic.BaseModel):
        name: str

        @pydantic.field_serializer("name", when_used="json")
        def _refuse(self, value: str) -> str:
            raise ValueError("not in JSON mode")

    assert to_jsonable(Picky(name="x")) == {"name": "x"}
    assert loads(dumps({"picky": Picky(name="x")})) == {"picky": {"name": "x"}}


def test_a_model_written_by_pydantic_is_byte_for_byte_what_dumps_writes() -> None:
    """`model_json` (the message feed's fast path) against `dumps`, on messages carrying every kind of value."""
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    odd = {"when": when, "day": dt.date(2026, 1, 2), "id": uuid.UUID(int=7), "point": Point(3), "opaque": Opaque(),
           "raw": b"bytes", "nan": float("nan"), "inf": float("-inf"), "tuple": (1, 2.5), "set": {3},
           "floats": [0.1, 1e16, 1e-7, -0.0, 5e-324, 1.7976931348623157e308, 123456789012345680000.0],
           "big": 2**63 - 1, "nested": {"deep": [{"x": None, "y": True}]}, "keys": {1: "int", 2.5: "float"},
           "error": ValueError("boom"), "interrupt": Interrupt(value={"ask": 1}, id="i")}
    texts = ["word", " ", "é", '"quoted"', "line\n", "\u2028", "tab\t", "\\", "\x00\x01\x1f\x7f", "🙂", "<b>&"]
    messages = [AIMessageChunk(content=text, id="run-1") for text in texts] + [
        AIMessage(content="x", id="m1", response_metadata=odd, additional_kwargs={"k": odd},
                  tool_calls=[{"name": "search", "args": {"q": "x", "n": 1.5}, "id": "c1"}],
                  usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}),
        AIMessageChunk(content=[{"type": "text", "text": "hi", "index": 0}], id="run-2",
                       tool_call_chunks=[{"name": "f", "args": '{"a": 1}', "id": "c2", "index": 0}],
                       chunk_position="last"),
        HumanMessage(content=[{"type": "image_url", "image_url": {"url": "data:,"}}], name="n"),
        ToolMessage(content="42", tool_call_id="c1", artifact=Point(1), status="error")]
    for message in messages:
        assert model_json(message) == dumps(message), message


def test_a_model_whose_json_mode_fails_is_written_by_dumps() -> None:
    import pydantic

    class Picky(pydantic.BaseModel):
        name: str

        @pydantic.field_serializer("name", when_used="json")
        def _refuse(self, value: str) -> str:
            raise ValueError("not in JSON mode")

    assert model_json(Picky(name="x")) == dumps(Picky(name="x")) == b'{"name":"x"}'


def test_floats_and_characters_are_written_by_pydantic_as_dumps_writes_them() -> None:
    import math
    import random
    import struct

    rng = random.Random(1)
    floats = [x for x in (struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(20_000))
              if math.isfinite(x)] + [rng.uniform(-1e6, 1e6) for _ in range(5_000)]
    text = "".join(chr(i) for i in range(0x3000)) + "\ue000\U0001f642"
    message = AIMessage(content=text, id="m", response_metadata={"floats": floats})
    assert model_json(message) == dumps(message)


def _traced_per_object(make: Callable[[], bytes], n: int = 200) -> float:
    """Bytes that each of `n` objects made by `make` keeps allocated (tracemalloc: what the allocator handed
    out, not what `len()` or `sys.getsizeof` say)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [make() for _ in range(n)]
        return (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()


def test_bytes_kept_take_their_own_length() -> None:
    """orjson hands out its output buffer as it grew it (at least 4 KiB, up to about twice the output): bytes
    held after the call (a stream's events) are copied to their length."""
    for value in ({"run_id": "r", "attempt": 1}, {"text": "y" * 3000}, {"documents": ["z" * 5000] * 40}):
        kept = dumps_kept(value)
        assert kept == dumps(value)
        assert _traced_per_object(functools.partial(dumps_kept, value)) < len(kept) + 128, len(kept)
