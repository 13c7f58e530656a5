"""The objects an app made to start are kept out of the garbage collector's full scans while it serves
(`threadline/heap.py`), and handed back to the collector when it stops."""

from __future__ import annotations

import gc

from asgi_lifespan import LifespanManager

from threadline.api.app import create_app
from threadline.settings import Settings


async def test_the_startup_heap_is_frozen_while_the_app_serves(settings: Settings) -> None:
    gc.unfreeze()  # whatever an earlier app of this test process left
    app = create_app(settings)
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30):
        assert gc.get_freeze_count() > 10_000  # modules, graphs, models: the process's startup objects
    assert gc.get_freeze_count() == 0
