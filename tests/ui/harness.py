"""A real `threadline serve` with the bundled example agents, and Debian's chromium driven by Playwright:
shared by the console's browser tests (tests/test_ui_browser.py) and the screenshots (tests/ui/screenshots.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.processes import serving

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is absent (scripts/test installs it: apt-get install chromium)"
    return None


@contextmanager
def serve_example(folder: Path, *args: str) -> Iterator[str]:
    """`threadline serve` in an empty `folder` (so the bundled example agents) on a free loopback port."""
    with serving(folder, *args) as (url, _):
        yield url


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium (Debian's, never a downloaded one) with a laptop-sized page context."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
