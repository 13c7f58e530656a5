"""The byte budgets of the Redis broker's buffers, kept by the process that publishes into them.

Redis trims a stream by length or by id, not by bytes. The process that publishes a run's events (its
worker) knows what each weighs: it keeps the size of each event it published that is still kept, and says
how many of the newest to keep (`XTRIM MAXLEN`, in the same round trip as the events), so that each run's
stream stays within `buffer_bytes` and everything this process published within `total_bytes` (finished runs
first, oldest first, then the oldest events of the largest running one), as `MemoryBroker` does in memory.
Pure bookkeeping: no I/O. Events are counted as they are sent: a batch Redis did not store is counted all
the same (the stream then keeps a little less than it could, until it expires).

A run that moves to another worker (its first one died) starts a new account there: the events of the
first worker are then bounded by count (`buffer_events`) and by their expiry only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class ByteBudget:
    """Sizes of the events this process published that Redis still keeps, and what to trim next."""

    def __init__(self, buffer_events: int, buffer_bytes: int, total_bytes: int, retain_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.buffer_events, self.buffer_bytes, self.total_bytes = buffer_events, buffer_bytes, total_bytes
        self.retain_seconds, self._clock = retain_seconds, clock
        self._running: dict[str, tuple[deque[int], list[int]]] = {}  # run → (sizes, oldest first; [their sum])
        self._ended: dict[str, tuple[float, int]] = {}  # run → (when it ended, bytes kept), oldest first
        self._trims: dict[str, int] = {}  # run → how many of its newest events to keep
        self.held = 0  # bytes of every run counted here

    def added(self, run_id: str, size: int) -> None:
        events, total = self._running.setdefault(run_id, (deque(), [0]))
        events.append(size)
        total[0] += size
        self.held += size
        while len(events) > 1 and (len(events) > self.buffer_events or total[0] > self.buffer_bytes):
            self._drop_oldest(run_id)
        self._within_total()

    def ended(self, run_id: str) -> None:
        """The run's stream ended: what it keeps is counted as one block, dropped whole when over budget."""
        account = self._running.pop(run_id, None)
        if account is not None:
            self._ended[run_id] = (self._clock(), account[1][0])
        cutoff = self._clock() - self.retain_seconds
        for old, (when, size) in list(self._ended.items()):  # expired in Redis by now: forgotten here
            if when >= cutoff:
                break
            del self._ended[old]
            self.held -= size

    def trims(self) -> dict[str, int]:
        """What to trim now, and forget: run → how many of its newest events to keep."""
        trims, self._trims = self._trims, {}
        return trims

    def _drop_oldest(self, run_id: str) -> None:
        events, total = self._running[run_id]
        size = events.popleft()
        total[0] -= size
        self.held -= size
        self._trims[run_id] = len(events)

    def _within_total(self) -> None:
        while self.held > self.total_bytes and self._ended:
            run_id = next(iter(self._ended))
            self.held -= self._ended.pop(run_id)[1]
            self._trims[run_id] = 0
        while self.held > self.total_bytes and self._running:
            run_id = max(self._running, key=lambda r: self._running[r][1][0] if len(self._running[r][0]) > 1 else 0)
            if len(self._running[run_id][0]) <= 1:
                return
            self._drop_oldest(run_id)
