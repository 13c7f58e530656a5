"""Threadline serves the gallery on every supported Python this machine has, not only on the suite's own.

The suite's own Python (the one `scripts/test` built `.venv` with, 3.11 where available) runs
tests/test_gallery.py directly. For each other supported minor version found on PATH (`python3.12`) or
through pyenv (`pyenv versions`), this test builds a venv `.venv-py3.12` once (rebuilt when pyproject.toml
changes) and runs the gallery tests on SQLite in it. A version that is not installed is skipped, and the skip
says so (`pytest -rs`); under CI=true a venv that cannot be built fails.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds venvs and serves the gallery from them

ROOT = Path(__file__).resolve().parents[1]
SUPPORTED = ["3.11", "3.12", "3.13"]


def _works(python: str, version: str) -> bool:
    try:
        out = subprocess.run([python, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def find_python(version: str) -> str | None:
    """An interpreter of this minor version: `python3.X` on PATH, else one of pyenv's versions."""
    on_path = shutil.which(f"python{version}")
    if on_path and _works(on_path, version):
        return on_path
    pyenv = shutil.which("pyenv")
    if pyenv:
        listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, timeout=30)
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30).stdout.strip()
        for name in sorted(listed.stdout.split(), reverse=True):
            candidate = Path(root) / "versions" / name / "bin" / "python"
            if name.startswith(f"{version}.") and candidate.exists() and _works(str(candidate), version):
                return str(candidate)
    return None


def _venv(version: str, python: str) -> Path:
    """`.venv-py<version>` with Threadline and its test extras, rebuilt when pyproject.toml changes."""
    venv = ROOT / f".venv-py{version}"
    stamp = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    marker = venv / ".installed"
    if marker.exists() and marker.read_text() == stamp:
        return venv
    if not (venv / "bin" / "python").exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-e", ".[test]"],
                               cwd=ROOT, capture_output=True, text=True, timeout=900)
    if installed.returncode != 0:
        message = f"could not install Threadline into {venv.name}:\n{installed.stderr[-3000:]}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    marker.write_text(stamp)
    return venv


@pytest.mark.parametrize("version", [v for v in SUPPORTED if v != "%d.%d" % sys.version_info[:2]])
def test_gallery_on_another_python(version: str) -> None:
    python = find_python(version)
    if python is None:
        pytest.skip(f"Python {version} is not installed here (neither python{version} on PATH nor in pyenv)")
    venv = _venv(version, python)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    run = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_gallery.py", "-k", "sqlite"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"gallery on Python {version}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    assert " passed" in run.stdout.splitlines()[-1]


def test_the_suite_runs_on_a_supported_python() -> None:
    assert "%d.%d" % sys.version_info[:2] in SUPPORTED
