"""Without the reference server the differential suite skips locally and fails under CI=true."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.differential.harness import start_reference


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_missing_reference_fails_under_ci_and_skips_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   ci: str) -> None:
    monkeypatch.setenv("THREADLINE_REF_VENV", str(tmp_path / "no-such-venv"))
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="reference server is not installed"):
        start_reference(tmp_path)
