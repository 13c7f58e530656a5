"""How LangGraph values become JSON: messages as LangGraph's server shows them, whatever they carry."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.types import Interrupt

from threadline.serde import dumps, loads, to_jsonable


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
