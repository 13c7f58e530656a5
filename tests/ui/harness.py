"""A real `threadline serve` with the bundled example agents, and Debian's chromium driven by Playwright:
shared by the console's browser tests (tests/test_ui_browser.py) and the screenshots (tests/ui/screenshots.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).parents[2]


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "threadline", "serve", "--port", "0", *args], cwd=folder,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=log)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            found = re.search(r"listening on (http://\S+)", line)
            url = found.group(1).rstrip("/") if found else None
        assert url, f"no banner; server log:\n{(folder / 'server.log').read_text()}"
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


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
