"""Threadline serves the gallery on every supported Python this machine has, not only on the suite's own.

The suite's own Python (the one `scripts/test` built `.venv` with, 3.11 where available) runs
tests/test_gallery.py directly. For each other supported minor version found on PATH (`python3.12`) or
through pyenv (`pyenv versions`), `scripts/test` builds a venv with Threadline's dependencies before the suite
(`tests/environments.py`: `./.venv-py3.12`, cached outside the checkout), and this test runs the gallery tests
on SQLite in it, with the checkout on PYTHONPATH. A version that is not installed is skipped, and the skip says
so (`pytest -rs`); a venv that could not be built skips with the reason, and fails under CI=true.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import environments
from tests.environments import ROOT, SUPPORTED, find_python, in_ci, other_versions, python_venv, ready


# Builds nothing (scripts/test did), but serves the gallery from another interpreter: a whole pytest run of
# tests/test_gallery.py's SQLite cases, minutes on a slow machine.
@pytest.mark.e2e  # the gallery under another Python
@pytest.mark.timeout(900)
@pytest.mark.parametrize("version", other_versions())
def test_gallery_on_another_python(version: str) -> None:
    python = find_python(version)
    if python is None:
        pytest.skip(f"Python {version} is not installed here (neither python{version} on PATH nor in pyenv)")
    venv = python_venv(version)
    if not ready(venv):
        reason = (f"{venv.name} is not built (scripts/test builds it with `.venv/bin/python -m tests.environments`;"
                  " see its output for why it could not)")
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_gallery.py", "-k", "sqlite"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, f"gallery on Python {version}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    assert " passed" in run.stdout.splitlines()[-1]


def test_the_suite_runs_on_a_supported_python() -> None:
    assert "{}.{}".format(*sys.version_info[:2]) in SUPPORTED


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_venv_not_built_fails_under_ci_and_skips_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            ci: str) -> None:
    """The test never builds a venv itself (a test bounded at 120 s cannot wait for pip): one scripts/test could
    not build is a skip with the reason, and a failure under CI=true."""
    monkeypatch.setattr(sys.modules[__name__], "python_venv", lambda version: tmp_path / f"venv-{version}")
    monkeypatch.setattr(sys.modules[__name__], "find_python", lambda version: sys.executable)
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="is not built"):
        test_gallery_on_another_python("3.99")
    assert not (tmp_path / "venv-3.99").exists()


def test_environments_are_cached_outside_the_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A fresh clone finds what an earlier run on this machine built: the cache is keyed by content, not by
    the checkout's path, and a change of pins is a new folder."""
    monkeypatch.setenv("THREADLINE_ENV_CACHE", str(tmp_path))
    assert environments.cache_root() == tmp_path
    assert not str(environments.cache_root()).startswith(str(ROOT))
    requirements = environments.threadline_requirements()
    assert any(r.startswith("langgraph") for r in requirements) and any(r.startswith("pytest") for r in requirements)
    assert not any(r.startswith("threadline") for r in requirements)  # its own extras are expanded, not fetched
    assert any(r.startswith("opentelemetry-sdk") for r in requirements)  # from threadline[otel]
    assert environments._key("py", *requirements) == environments._key("py", *requirements)
    assert environments._key("py", *requirements) != environments._key("py", *requirements, "extra==1")
