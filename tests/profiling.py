"""Where a test run's time goes, per module: opt in with `-p tests.profiling` (never loaded otherwise).

    .venv/bin/python -m pytest -q -m "not slow" -p tests.profiling

At the end it prints, per module: tests, seconds (setup + call + teardown), the CPU seconds the process used
meanwhile (every thread's: seconds well above it went to waiting, on timers, sleeps, the database or other
processes' load), app starts (`Runtime.start`), the seconds spent opening, starting and closing runtimes, and
the seconds test code asked to sleep (calls of `asyncio.sleep`/`time.sleep` of 50 ms or more made from tests/,
the test agents' own included and the bounded waits of tests/waits.py left out).
`THREADLINE_TEST_PROFILE=<file>` writes the same as JSON, with each sleep's place, and each test's seconds and
CPU seconds (`"tests"`). It patches `Runtime` and the two sleeps for the run, so it measures what it observes
only roughly: compare runs made the same way, old tree and new alternated.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
import time
from typing import Any

import pytest

_module = ["<none>"]
_stats: collections.defaultdict[str, collections.defaultdict[str, float]] = collections.defaultdict(
    lambda: collections.defaultdict(float))
_tests: dict[str, list[float]] = {}  # test id: [seconds, CPU seconds]
_async_sleep = asyncio.sleep
_sleep = time.sleep


def _sleeping(delay: float) -> None:
    if not delay or delay < 0.05:
        return
    frame = sys._getframe(2)
    for _ in range(3):  # the test's own line, or a helper's in tests/ that it called
        if frame is None:
            return
        name = frame.f_code.co_filename
        if f"{os.sep}tests{os.sep}" in name and not name.endswith("waits.py"):
            counts = _stats[_module[0]]
            counts["sleep_s"] += delay
            counts[f"sleep {os.path.basename(name)}:{frame.f_lineno}"] += delay
            return
        frame = frame.f_back


async def _profiled_async_sleep(delay: float, result: Any = None) -> Any:
    _sleeping(delay)
    return await _async_sleep(delay, result)


def _profiled_sleep(delay: float) -> None:
    _sleeping(delay)
    _sleep(delay)


def _timed(name: str, method: Any) -> Any:
    async def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        if name == "start":
            _stats[_module[0]]["starts"] += 1
        try:
            return await method(*args, **kwargs)
        finally:
            _stats[_module[0]][f"{name}_s"] += time.perf_counter() - started

    return timed


def pytest_configure(config: pytest.Config) -> None:
    from threadline.core.runtime import Runtime

    asyncio.sleep = _profiled_async_sleep
    time.sleep = _profiled_sleep  # type: ignore[assignment]
    Runtime.open = classmethod(_timed("open", Runtime.open.__func__))  # type: ignore[method-assign, assignment, attr-defined]
    Runtime.start = _timed("start", Runtime.start)  # type: ignore[method-assign]
    Runtime.close = _timed("close", Runtime.close)  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _module[0] = item.nodeid.split("::")[0]
    started, cpu = time.perf_counter(), time.process_time()
    yield
    spent = [time.perf_counter() - started, time.process_time() - cpu]
    _tests[item.nodeid] = spent
    _stats[_module[0]]["cpu_s"] += spent[1]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    counts = _stats[report.nodeid.split("::")[0]]
    counts["seconds"] += report.duration
    if report.when == "call":
        counts["tests"] += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    rows = sorted(_stats.items(), key=lambda row: -row[1]["seconds"])
    write = terminalreporter.write_line
    write(f"{'module':44} {'tests':>5} {'seconds':>8} {'cpu':>6} {'starts':>6} {'open':>5} {'start':>5} "
          f"{'close':>5} {'sleep':>5}")
    for module, c in rows:
        write(f"{module:44} {c['tests']:5.0f} {c['seconds']:8.1f} {c['cpu_s']:6.1f} {c['starts']:6.0f} "
              f"{c['open_s']:5.1f} {c['start_s']:5.1f} {c['close_s']:5.1f} {c['sleep_s']:5.1f}")
    write(f"{'all':44} {sum(c['tests'] for _, c in rows):5.0f} {sum(c['seconds'] for _, c in rows):8.1f} "
          f"{sum(c['cpu_s'] for _, c in rows):6.1f} {sum(c['starts'] for _, c in rows):6.0f}")
    if path := os.environ.get("THREADLINE_TEST_PROFILE"):
        with open(path, "w") as out:
            json.dump({"modules": {module: dict(c) for module, c in rows}, "tests": _tests}, out, indent=1)
