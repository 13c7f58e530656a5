"""An outage of the broker's service as the log tells it: one line when it starts, a count at most once per
`report_seconds` while it lasts, one line when it ends.

During an outage every exchange with Redis fails (each request that needs it, each stream, each run's events),
and the server handles each failure (a 503, an `error` event, events not sent, a retry): a warning per failure
would bury the log (thousands of lines for a few seconds under load) and say nothing more than the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from threadline.errors import BrokerUnavailable


class Outage:
    """Counts the failed exchanges with one service and the items it could not send, and logs them (see the
    module docstring). Not thread-safe: one per broker, used from its event loop."""

    def __init__(self, service: str, log: logging.Logger, *, report_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, on_end: Callable[[], None] | None = None) -> None:
        self.service = service
        self.on_end = on_end  # called once an outage is over (the broker re-sends what must not stay lost)
        self.report_seconds = report_seconds
        self._log = log
        self._clock = clock
        self.since: float | None = None  # when the outage began (clock seconds); None while the service answers
        self._failures = self._unsent = 0  # since the outage began
        self._reported = 0.0
        self._reported_failures = self._reported_unsent = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> None:
        """An exchange failed (the caller handles it: a 503, a retry)."""
        now = self._clock()
        if self.since is None:
            self.since = self._reported = now
            self._failures, self._unsent = 1, 0
            self._reported_failures = self._reported_unsent = 0
            self._log.warning("%s unavailable: %s: %s. Requests that need it answer 503, stream events are not "
                              "sent, runs go on; the listener resubscribes with backoff. A count follows every %g s "
                              "while it lasts", self.service, type(exc).__name__,
                              str(exc).rstrip(".") or "no answer in time", self.report_seconds)
            return
        self._failures += 1
        self._report(now)

    def unsent(self, items: int) -> None:
        """`items` stream events, stream ends and signals could not be sent (their senders do not wait)."""
        self._unsent += items
        if self.since is not None:
            self._report(self._clock())

    def recovered(self) -> None:
        """An exchange succeeded: the outage, if any, is over. Cheap when there is none (called on every one)."""
        if self.since is None:
            return
        self._log.warning("%s is back after %.1f s: %d exchanges failed and %d stream events, ends and signals "
                          "were not sent meanwhile", self.service, self._clock() - self.since, self._failures,
                          self._unsent)
        self.since = None
        self._unsent = 0
        if self.on_end is not None:
            self.on_end()

    def _report(self, now: float) -> None:
        if now - self._reported < self.report_seconds:
            return
        assert self.since is not None
        self._log.warning("%s still unavailable after %.0f s: %d exchanges failed and %d stream events, ends and "
                          "signals were not sent in the last %.0f s", self.service, now - self.since,
                          self._failures - self._reported_failures, self._unsent - self._reported_unsent,
                          now - self._reported)
        self._reported = now
        self._reported_failures, self._reported_unsent = self._failures, self._unsent


@contextlib.asynccontextmanager
async def exchange(outage: Outage, seconds: float, errors: tuple[type[BaseException], ...], *, unavailable: str,
                   timeouts: tuple[type[BaseException], ...] = (TimeoutError,)) -> AsyncIterator[None]:
    """One exchange of a broker with its service, bounded in time and told to its outage record: a driver error
    (one of `errors`) becomes `BrokerUnavailable` at the backend edge, whose message (`unavailable`, then the
    reason) names no driver; the outage's log lines keep the driver's words for the operator."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except errors as exc:
        outage.failed(exc)
        reason = "no answer in time" if isinstance(exc, timeouts) else "connection lost"
        raise BrokerUnavailable(f"{unavailable} ({reason}). Retry shortly.") from exc
    outage.recovered()
