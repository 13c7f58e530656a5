"""How `threadline serve` and `threadline worker` stop on SIGINT (Ctrl-C) and SIGTERM, however many arrive.

1. The first signal stops gracefully: no new connections; open run streams end with a frame that tells the
   client to reconnect (`api/sse.py`); other open requests get `GRACE_SECONDS`; then the runtime closes: runs
   in flight go back to the queue and the database closes (its lock with it).
2. A second signal stops waiting for open requests: the runtime closes now. The process exits anyway
   `FORCE_SECONDS` later.
3. A third signal exits at once (`os._exit`). The operating system releases the database's lock; runs the
   process still held are taken back as after a crash (at the next start, or by a peer's sweeper).

The handlers are `signal.signal` handlers, not the loop's: they run even while the loop is blocked, so the
third signal always ends the process. A node still running in a thread after the runtime closed (a
synchronous node cannot be stopped) does not hold the process: it exits after `THREAD_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

log = logging.getLogger("threadline")

#: Open requests after the first signal, before they are cut; whole seconds (uvicorn types its
#: timeout_graceful_shutdown as an int).
GRACE_SECONDS = 10
FORCE_SECONDS = 10.0  # after the second signal, before the process exits whatever it is doing
THREAD_SECONDS = 5.0  # nodes still running in threads once the runtime has closed

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_now(code: int) -> None:
    """End the process at once, with what it printed flushed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class Stop:
    """Counts SIGINT and SIGTERM while installed and takes the step each one calls for.

    `graceful` and `now` are called on the loop (the first and second signal); the third signal, or
    `FORCE_SECONDS` after the second, exits from the handler itself."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, graceful: Callable[[], Any],
                 now: Callable[[], Any]) -> None:
        self.loop = loop
        self.steps = [graceful, now]
        self.count = 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only the exit happens here; the steps and their logging run on the loop (logging from a signal
        # handler could interleave with a record being written).
        self.count += 1
        if self.count >= 3:
            os.write(2, f"threadline: {signal.Signals(signum).name} again: exiting at once; runs still held "
                        "are recovered as after a crash\n".encode())
            exit_now(128 + signum)
        self.loop.call_soon_threadsafe(self._step, self.count, signum)

    def _step(self, count: int, signum: int) -> None:
        name = signal.Signals(signum).name
        if count == 1:
            log.info("%s: stopping; runs in flight go back to the queue (again: stop without waiting for "
                     "open requests)", name)
        else:
            log.warning("%s: stopping now, without waiting for open requests (again: exit at once)", name)
            self.loop.call_later(FORCE_SECONDS, self._too_long, signum)
        self.steps[count - 1]()

    def _too_long(self, signum: int) -> None:
        log.error("still stopping %.0f s after the second signal: exiting", FORCE_SECONDS)
        exit_now(128 + signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stop]:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def without_stuck_threads(code: int = 0) -> None:
    """Let the loop's thread pool finish, for `THREAD_SECONDS` at most; past that, exit without it.

    `asyncio.run` and the interpreter both wait for every thread of the pool, so a node still running in
    one (a synchronous node is not stopped by cancelling its run) would otherwise hold the process open."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(THREAD_SECONDS):
            await loop.shutdown_default_executor()
    except TimeoutError:
        log.warning("a node is still running in a thread %.0f s after the shutdown: exiting without it",
                    THREAD_SECONDS)
        logging.shutdown()
        exit_now(code)
