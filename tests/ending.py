"""How a test session ends: a test past its timeout stops the run with a report, and the processes the tests
started end with the session (a pytest plugin, registered by `tests/conftest.py`).

A test that starts a real process stops it itself (`tests/processes.py: stop`), but not when the run is cut
short: pytest-timeout's `thread` method ends the run with `os._exit`, which runs no teardown, and an
end-to-end test's `threadline serve` and `threadline worker` processes were left running for an hour. So on
timeout, and at the session's end whatever remains, every process below the test process is sent SIGTERM,
then SIGKILL once `GRACE` has passed.

Under pytest-xdist each worker ends its own; the controller, whose children are the workers, ends none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

GRACE = 5.0  # seconds between SIGTERM and SIGKILL: a server drains its runs on SIGTERM


def descendants(pid: int | None = None) -> list[int]:
    """The processes below `pid` (this one by default), parents before their children, read from Linux's
    /proc (`task/*/children`); empty elsewhere."""
    found: list[int] = []
    pending = [os.getpid() if pid is None else pid]
    while pending:
        parent = pending.pop(0)
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                pending += children
    return found


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for its parent to read its status."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120].strip()
    except OSError:
        return "?"


def end_processes(grace: float = GRACE) -> list[str]:
    """SIGTERM every process below this one, SIGKILL those still running after `grace` s; the commands of
    those it found running."""
    running = [pid for pid in descendants() if _alive(pid)]
    commands = [f"{pid} {_command(pid)}" for pid in running]
    for pid in running:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in running):
        time.sleep(0.05)
    for pid in running:
        if _alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return commands


def _runs_tests(config: pytest.Config) -> bool:
    """Not pytest-xdist's controller: its children are its workers, which end their own."""
    return config.pluginmanager.getplugin("dsession") is None


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if not _runs_tests(config):
        return
    left = end_processes()
    if left:
        sys.stderr.write(f"\ntests/ending.py: ended {len(left)} process(es) the tests left running: "
                         + "; ".join(left) + "\n")


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's `thread` method (pyproject): a test past its timeout ends its test process (the whole
    run; under pytest-xdist, its worker, which xdist reports as crashed and replaces), because a
    hung asyncio test cannot be stopped from inside (its loop may hang again in its own teardown). First,
    the report names the test and shows its loop's tasks, which thread stacks alone do not, and the
    processes the tests started are ended."""
    if settings.method != "thread":
        return None
    import pytest_timeout

    def expire() -> None:
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture(item)
        sys.stderr.write(f"\n+++ Timeout: {item.nodeid} still running after {settings.timeout:.0f} s; "
                         "this test process stops here\n")
        _dump_loop_tasks()
        ended = end_processes()
        if ended:
            sys.stderr.write(f"+++ ended {len(ended)} process(es) the tests started: {'; '.join(ended)}\n")
        pytest_timeout.timeout_timer(item, settings)  # thread stacks, then os._exit(1)

    timer = threading.Timer(settings.timeout, expire)
    timer.name = f"timeout {item.nodeid}"
    timer.daemon = True

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]
    timer.start()
    return True


def _dump_loop_tasks() -> None:
    """The asyncio tasks of the loop running in the main thread, if one is, with their stacks."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None and not (frame.f_code.co_name == "run_forever" and "self" in frame.f_locals):
        frame = frame.f_back
    if frame is None:
        return
    try:
        tasks = asyncio.all_tasks(frame.f_locals["self"])
    except Exception:  # noqa: BLE001 - a diagnostic on the way out: its own failure must not hide the test's
        return
    for task in tasks:
        sys.stderr.write(f"--- {task!r}\n")
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()
