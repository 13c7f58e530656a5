"""The objects a process made to start (modules, graphs, pydantic models: about 200,000), out of the cyclic
garbage collector's way while it serves.

Python's collector scans every tracked object of the oldest generation in a full collection, which a request
that allocates much (a history of 200 checkpoints, a 1 MB state) triggers every few requests: with the startup
objects in that generation, each one took about 120 ms on the shared 2-core machine, about a quarter of the CPU
of a history request on average (`bench/README.md`, "Large state and history, fewer passes"). `gc.freeze()`
moves them to a generation no collection scans; they stay alive anyway. Unfrozen when the process's app or
workers stop, so that what they leave can be collected (tests start many apps in one process).

After a long run the interpreter's free lists are full: up to 2,000 freed tuples of each small size (and lists,
dicts, floats) kept for reuse, scattered over the small-object allocator's arenas, each arena (1 MiB) kept while
one of them lives in it. Only a full collection empties those lists, and a process that goes idle allocates
nothing that would set one off: after 8 runs of 16,000 tokens that held about 40 MB in a server, 85 MB in a
`threadline worker`. `AfterRuns` runs one once the process has no run left running after a long one (numbers in
`bench/README.md`, "What a finished run still holds"), then asks glibc to give back the free memory it keeps
(`malloc_trim`: 3-8 MB more, in 1-2 ms).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from collections.abc import Callable, Iterator

#: A run that executed at least this long owes a full collection (after short runs, a busy process's own
#: collections come soon enough).
COLLECT_AFTER_SECONDS = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where there is none (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


MALLOC_TRIM = _malloc_trim()


@contextlib.contextmanager
def startup_frozen() -> Iterator[None]:
    """Freeze what exists now (the end of startup) until the block ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class AfterRuns:
    """A full collection once a process that ran a long run has no run left running: one a burst, not one a
    run. With the startup heap frozen it scans only what was made since (6-20 ms after 8 long runs)."""

    def __init__(self) -> None:
        self.owed = False

    def run_ended(self, seconds: float, running: int) -> bool:
        """A run that executed for `seconds` ended, `running` runs go on here; whether it collected."""
        self.owed = self.owed or seconds >= COLLECT_AFTER_SECONDS
        if not self.owed or running:
            return False
        self.owed = False
        gc.collect()
        if MALLOC_TRIM is not None:
            MALLOC_TRIM(0)
        return True
