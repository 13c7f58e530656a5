"""What storage, the serializer and the clock can hold, checked once at the edge: every JSON value a client
sends (a request model's body, a Protocol v2 command) is walked here before any route sees it.

Python's `json` accepts values nothing downstream can keep: integers past 64 bits (SQLite and orjson refuse
them), `NaN` and `Infinity` (JSON has neither; PostgreSQL's jsonb refuses them), strings with a lone surrogate
(`"\\ud800"`: no UTF-8 encodes it), the NUL character (PostgreSQL's text and jsonb refuse it), and
nesting deep enough to exhaust the stack. Each would be a 500 deep inside a transaction; here it is a 422
naming where in the body it is.
"""

from __future__ import annotations

import json
import math
from typing import Any

from threadline.errors import InvalidInput

#: How deep objects and arrays may nest in a request (orjson, which stores them, stops at 255).
MAX_DEPTH = 100
#: The integers a body may carry: those SQLite, PostgreSQL's bigint and orjson all hold.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: The longest delay or time to live (in seconds) a request may ask for: a century, far inside `datetime`.
MAX_SECONDS = 100 * 365 * 24 * 3600


def problem(value: Any) -> tuple[tuple[str | int, ...], str] | None:
    """Where in `value` (a path of keys and indexes) the first thing storage cannot hold is, and what it is;
    None when it is all storable. Iterative, so a deep value cannot exhaust the stack being checked."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return path, "Strings must be valid Unicode (this one has a lone surrogate)"
            if "\x00" in item:
                return path, "Strings may not hold the NUL character (\\u0000), which PostgreSQL cannot store"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not INT_MIN <= item <= INT_MAX:
                return path, "Integers must fit in 64 bits (from -2**63 to 2**63 - 1)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path, "Numbers must be finite (JSON has no NaN or Infinity)"
        elif isinstance(item, (dict, list)):
            if len(path) >= MAX_DEPTH:
                return path, f"Objects and arrays may nest at most {MAX_DEPTH} deep"
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str) and not _encodable(key):
                        return (*path, key), "Keys must be valid Unicode (this one has a lone surrogate)"
                    if isinstance(key, str) and "\x00" in key:
                        return (*path, key), ("Keys may not hold the NUL character (\\u0000), "
                                              "which PostgreSQL cannot store")
                    stack.append((child, (*path, key)))
            else:
                stack.extend((child, (*path, i)) for i, child in enumerate(item))
    return None


def printable(path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """`path` with any key that is no valid text escaped (`\\ud800`), so an error naming it can be sent, and
    a deep one shortened (`input.a.a.a.a.a.a.a.….a`)."""
    if len(path) > 10:
        path = (*path[:8], "…", path[-1])
    return tuple(p if isinstance(p, int) else p.encode("utf-8", "backslashreplace").decode() for p in path)


def dotted(path: tuple[str | int, ...]) -> str:
    """`metadata.k.0`: a path as `threadline.api.errors` names fields."""
    return ".".join(str(p) for p in printable(path)) or "body"


def check(value: Any) -> Any:
    """`value`, if storage can hold all of it; else InvalidInput naming where it cannot."""
    found = problem(value)
    if found is not None:
        path, message = found
        raise InvalidInput(f"{dotted(path)}: {message}")
    return value


def loads(raw: bytes | str) -> Any:
    """A JSON body decoded and `check`ed; ValueError when it is not JSON (too deep to decode counts as
    not JSON: the decoder's own recursion stops it before `check` could)."""
    try:
        return check(json.loads(raw))
    except RecursionError:
        raise InvalidInput(f"body: Objects and arrays may nest at most {MAX_DEPTH} deep") from None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
