"""CPU time and resident memory of a target's processes, read from /proc (Linux).

A target is one or more process groups (the bench starts each server process with ``start_new_session=True``,
so its group holds it and everything it spawns). ``Sampler`` rescans the groups every ``interval_s``:

* CPU = utime + stime of every process ever seen in the groups (its last reading; a process that exits
  between two scans loses at most one interval of CPU);
  ``cpu_by_group()`` gives the same per process group (a target's roles: the API process, each worker);
* RSS = the sum of ``VmRSS`` over the processes alive at a scan; ``peak()`` is the largest sum since ``reset_peak()``;
* write calls = ``syscw`` of ``/proc/<pid>/io`` (every ``write``-family system call of the process's threads:
  on a stream, mostly one per socket send), summed like CPU (``writes()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TypeVar

TICKS = os.sysconf("SC_CLK_TCK")
T = TypeVar("T", int, float)


def _stat(pid: int) -> tuple[int, float] | None:
    """(process group, CPU seconds) of `pid`, or None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
    return int(fields[2]), (int(fields[11]) + int(fields[12])) / TICKS


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds so far of the processes `pids` (those still alive), e.g. a database's server processes."""
    return sum(st[1] for st in map(_stat, pids) if st is not None)


def _syscw(pid: int) -> int:
    """Write-family system calls `pid` has made (its threads' included), 0 when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("syscw:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Sampler:
    """CPU and RSS of the processes in `groups` (process-group ids), sampled in the background."""

    def __init__(self, groups: list[int], interval_s: float = 0.1) -> None:
        self.groups = set(groups)
        self.interval_s = interval_s
        self.cpu_by_pid: dict[int, float] = {}
        self.writes_by_pid: dict[int, int] = {}
        self.group_of: dict[int, int] = {}
        self.last_rss = 0
        self._peak = 0
        self._task: asyncio.Task[None] | None = None

    def scan(self) -> None:
        rss = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            st = _stat(pid)
            if st is None or st[0] not in self.groups:
                continue
            self.cpu_by_pid[pid] = st[1]
            self.writes_by_pid[pid] = _syscw(pid) or self.writes_by_pid.get(pid, 0)
            self.group_of[pid] = st[0]
            rss += _rss_bytes(pid)
        self.last_rss = rss
        self._peak = max(self._peak, rss)

    def cpu_s(self) -> float:
        self.scan()
        return sum(self.cpu_by_pid.values())

    def writes(self) -> int:
        """Write-family system calls so far of every process seen (each process's last reading)."""
        self.scan()
        return sum(self.writes_by_pid.values())

    def writes_by_group(self) -> dict[int, int]:
        """Write-family system calls so far of each process group (its processes summed)."""
        return self._by_group(self.writes_by_pid, 0)

    def cpu_by_group(self) -> dict[int, float]:
        """CPU seconds so far of each process group (its processes summed), e.g. to split a target by role."""
        return self._by_group(self.cpu_by_pid, 0.0)

    def _by_group(self, by_pid: dict[int, T], zero: T) -> dict[int, T]:
        self.scan()
        out = dict.fromkeys(self.groups, zero)
        for pid, value in by_pid.items():
            out[self.group_of[pid]] += value
        return out

    def rss(self) -> int:
        self.scan()
        return self.last_rss

    def reset_peak(self) -> None:
        self.scan()
        self._peak = self.last_rss

    def peak(self) -> int:
        self.scan()
        return self._peak

    async def _loop(self) -> None:
        while True:
            self.scan()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
