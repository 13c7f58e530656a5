"""Turning LangGraph values (messages, interrupts, pydantic models, Sends) into JSON-ready data."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
import pydantic

_SCALARS = frozenset({str, int, float, bool, type(None)})


def to_jsonable(obj: Any) -> Any:
    """Recursively convert `obj` into plain JSON types the way LangGraph's server shows them."""
    kind = type(obj)
    # Exact types first: most of a state is plain dicts, lists and scalars, and the checks below for a
    # pydantic model or a Mapping are ABC checks, several times slower (a 200-checkpoint history: 50,000).
    if kind in _SCALARS:
        return obj
    if kind is dict:
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if kind is list:
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, pydantic.BaseModel):  # messages, most often: converted by pydantic itself, 4x faster
        try:
            return obj.model_dump(mode="json", fallback=to_jsonable)
        except Exception:  # noqa: BLE001 - a model whose JSON mode fails (its own serializer, say): its Python dump, converted here
            return to_jsonable(obj.model_dump())
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "model_dump") and callable(obj.model_dump):
        return to_jsonable(obj.model_dump())
    if hasattr(obj, "_asdict"):
        return to_jsonable(obj._asdict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    if isinstance(obj, (dt.datetime, dt.date)):
        return obj.isoformat()
    if isinstance(obj, uuid.UUID):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    if isinstance(obj, BaseException):
        return {"error": type(obj).__name__, "message": str(obj)}
    if hasattr(obj, "__dict__") and type(obj).__name__ in ("Interrupt", "Send", "Command"):
        return to_jsonable(vars(obj))
    return repr(obj)


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, default=to_jsonable, option=orjson.OPT_NON_STR_KEYS)


def dumps_kept(obj: Any) -> bytes:
    """`dumps(obj)` in a `bytes` of its own length, for bytes held after the call (a stream's events).

    orjson returns its output buffer as it grew it, never shrunk: since 3.13 at least 4 KiB, and for larger
    outputs up to about twice their length plus what it reserved per container (a 61-byte event holds 4 KiB, a
    3 KB one 28 KiB, a 1 MB state 2 MiB; `len()` and `sys.getsizeof` show only the length). Held, that is
    memory no byte budget counts. A copy costs a few tens of microseconds a megabyte (`bench/README.md`, "What
    a stream's events really hold")."""
    return b"".join((dumps(obj), b""))  # two parts: always a new object, allocated at the joined length


def model_json(obj: pydantic.BaseModel) -> bytes:
    """`dumps(obj)` of a pydantic model, byte for byte, written by pydantic-core in one pass (no dict of the
    model in between: an `AIMessageChunk` in about 0.8 us against 4.5). The two agree on every JSON type as
    `dumps` writes it (floats shortest round-trip, the same escapes, `NaN` as `null`); what neither knows goes
    through `to_jsonable` on both paths. A model whose JSON mode fails goes through `dumps`, as before."""
    try:
        return obj.__pydantic_serializer__.to_json(obj, fallback=to_jsonable)
    except Exception:  # noqa: BLE001 - `dumps` converts it from its Python dump (`to_jsonable`)
        return dumps(obj)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)
