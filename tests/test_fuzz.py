"""A short fuzzing pass over every operation of `/openapi.json` (tests/fuzz.py): no generated request gets a
5xx. The longer run is a command (tests/fuzz.py's docstring)."""

from __future__ import annotations

import pytest

from tests.fuzz import fuzz
from threadline.settings import Settings

pytest.importorskip("schemathesis")
SECONDS = 30  # per backend, inside the suite's 120 s bound per test


@pytest.mark.slow
@pytest.mark.timeout(400)  # the first round covers every operation whatever the machine's speed (tests/fuzz.py)
def test_generated_requests_get_no_server_error(settings: Settings) -> None:
    figures = fuzz(settings, SECONDS)
    print(figures.summary())
    assert figures.cases >= figures.operations and len(figures.exercised) == figures.operations, figures.summary()
    assert not figures.server_errors, figures.summary()
