"""The objects an app made to start are kept out of the garbage collector's full scans while it serves
(`threadline/heap.py`), and handed back to the collector when it stops; a full collection once no run is left
running after a long one."""

from __future__ import annotations

import gc
import weakref

from asgi_lifespan import LifespanManager

from threadline.api.app import create_app
from threadline.heap import COLLECT_AFTER_SECONDS, AfterRuns
from threadline.settings import Settings


async def test_the_startup_heap_is_frozen_while_the_app_serves(settings: Settings) -> None:
    gc.unfreeze()  # whatever an earlier app of this test process left
    app = create_app(settings)
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30):
        assert gc.get_freeze_count() > 10_000  # modules, graphs, models: the process's startup objects
    assert gc.get_freeze_count() == 0


class _Cycle:
    """Garbage only a collection frees: it refers to itself."""

    def __init__(self) -> None:
        self.me = self


def _garbage() -> weakref.ref[_Cycle]:
    return weakref.ref(_Cycle())


def test_a_long_run_is_collected_after_once_none_runs() -> None:
    """A full collection (what empties the interpreter's free lists, which pin the allocator's arenas after a long
    run) when the last run running ends, as a process that goes idle would never set one off: once a burst, not
    after each run nor after short runs. Seen here by a cycle it frees."""
    after = AfterRuns()
    gc.disable()  # no collection but `AfterRuns`'s in this test
    try:
        left = _garbage()
        assert not after.run_ended(COLLECT_AFTER_SECONDS / 10, running=0)  # short runs owe nothing
        assert left() is not None
        assert not after.run_ended(COLLECT_AFTER_SECONDS * 5, running=2)  # a long one, while others run
        assert left() is not None
        assert after.run_ended(COLLECT_AFTER_SECONDS / 10, running=0)  # the last one ends: collected
        assert left() is None
        again = _garbage()
        assert not after.run_ended(COLLECT_AFTER_SECONDS / 10, running=0)  # owed once
        assert again() is not None
    finally:
        gc.enable()
