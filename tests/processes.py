"""Real `threadline` processes for end-to-end tests: the command, a clean environment, a server started on a
free port (its URL read from its banner), and a stop that always ends the process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]


def threadline_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "threadline", *args]


def clean_env() -> dict[str, str]:
    """The test's own THREADLINE_* must not leak into the server; the checkout is importable as installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def stop(proc: subprocess.Popen[Any], timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def serving(folder: Path, *args: str, command: str = "serve") -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`threadline <command>` started in `folder` on a free port; its URL (from its banner) and its process.
    Its stderr goes to `folder/server.log`, shown when no banner comes."""
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(threadline_cmd(command, "--port", "0", *args), cwd=folder, env=clean_env(), text=True,
                            stdout=subprocess.PIPE, stderr=log)
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
        yield url, proc
    finally:
        stop(proc)
        log.close()


class _Watch:
    """Fails a test that starts a process without being marked `slow` (or `e2e`): the fast loop
    (`-m "not slow"`) stays in-process. Any `subprocess.Popen` counts, asyncio's subprocesses included."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.started: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "subprocess.Popen" and self.item is not None:
            self.started.append(" ".join(str(a) for a in (args[1] or [args[0]])[:4]))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        allowed = item.get_closest_marker("slow") is not None
        self.item, self.started = (None if allowed else item), []
        try:
            return (yield)
        finally:
            self.item = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "teardown" and self.item is item and self.started and report.passed:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} started a process ({'; '.join(self.started[:3])}) but is not "
                               "marked slow: mark it `slow` (or its module `e2e`), or keep it in-process")
        return report


def watch(config: pytest.Config) -> None:
    """Install the check that tests outside the slow set start no process (once per interpreter)."""
    global _WATCH
    if _WATCH is None:
        _WATCH = _Watch()
        sys.addaudithook(_WATCH.audit)
    config.pluginmanager.register(_WATCH, "threadline-process-watch")


_WATCH: _Watch | None = None
