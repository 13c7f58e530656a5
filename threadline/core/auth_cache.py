"""langgraph.json `auth.cache`: the `@auth.authenticate` handler's answers, kept per caller for a while.

As LangGraph's server keeps them: the key is the values of the `cache_keys` headers the request shows (names
compared lowercase); a request that shows none of them is never answered from the cache; only accepted
callers are kept (a refusal is asked again each time); an answer is kept `ttl` seconds, and past `max_size`
answers the least recently used goes first. Per process: each API process keeps its own.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Key = tuple[tuple[bytes, bytes], ...]


class AuthCache:
    """A bounded map from the request's `cache_keys` headers to the caller they authenticated."""

    def __init__(self, cache_keys: Iterable[str], *, ttl: float, max_size: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.names = tuple(name.lower().encode("latin-1") for name in cache_keys)
        self.ttl = ttl
        self.max_size = max_size
        self.clock = clock
        self._answers: OrderedDict[Key, tuple[float, Any]] = OrderedDict()

    def key(self, headers: Mapping[bytes, bytes]) -> Key | None:
        """The request's key, or None when it shows none of the `cache_keys` headers."""
        shown = tuple((name, headers[name]) for name in self.names if name in headers)
        return shown or None

    def get(self, key: Key) -> Any | None:
        found = self._answers.get(key)
        if found is None:
            return None
        expires, user = found
        if expires <= self.clock():
            del self._answers[key]
            return None
        self._answers.move_to_end(key)
        return user

    def put(self, key: Key, user: Any) -> None:
        self._answers[key] = (self.clock() + self.ttl, user)
        self._answers.move_to_end(key)
        while len(self._answers) > self.max_size:
            self._answers.popitem(last=False)
