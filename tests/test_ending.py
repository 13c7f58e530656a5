"""A test run cut short by a timeout ends the processes its tests started (tests/ending.py), where it used to
leave a scale-out test's servers running after `os._exit`; a run that ends normally ends those left too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ending import _alive
from tests.processes import ROOT, clean_env

pytestmark = pytest.mark.e2e  # a pytest run of its own, which starts a process

HANGS = """
import subprocess, sys, time

def test_starts_a_server_and_hangs(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open({pidfile!r}, "w").write(str(child.pid))
    time.sleep({sleep})
"""


@pytest.mark.parametrize(("timeout", "sleep", "ending"), [("2", 600, "Timeout"), ("60", 0, "left running")])
def test_the_processes_a_run_started_end_with_it(tmp_path: Path, timeout: str, sleep: int, ending: str) -> None:
    pidfile = tmp_path / "child.pid"
    (tmp_path / "test_hangs.py").write_text(HANGS.format(pidfile=str(pidfile), sleep=sleep))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.ending",
                           "-o", f"timeout={timeout}", "-o", "timeout_method=thread", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_hangs.py")],
                          cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=90)
    pid = int(pidfile.read_text())
    try:
        assert ending in done.stderr + done.stdout, done.stderr
        assert not _alive(pid), f"process {pid} still running after the run ended:\n{done.stderr}"
    finally:
        if _alive(pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
