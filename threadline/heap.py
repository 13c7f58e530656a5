"""The objects a process made to start (modules, graphs, pydantic models: about 200,000), out of the cyclic
garbage collector's way while it serves.

Python's collector scans every tracked object of the oldest generation in a full collection, which a request
that allocates much (a history of 200 checkpoints, a 1 MB state) triggers every few requests: with the startup
objects in that generation, each one took about 120 ms on the shared 2-core machine, about a quarter of the CPU
of a history request on average (`bench/README.md`, "Large state and history, fewer passes"). `gc.freeze()`
moves them to a generation no collection scans; they stay alive anyway. Unfrozen when the process's app or
workers stop, so that what they leave can be collected (tests start many apps in one process).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def startup_frozen() -> Iterator[None]:
    """Freeze what exists now (the end of startup) until the block ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
