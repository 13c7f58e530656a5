"""The differential suite: the same langgraph-sdk sessions against LangGraph's server and Threadline.

Both servers run as real processes on loopback, serving the gallery (tests/gallery/langgraph.json); all
sessions run concurrently on both (the reference's queue polls about once a second, so one run costs ~1 s
there). Every difference must be listed in `accepted.py` with its reason, and every entry listed there must
still be seen (a fixed difference fails until its entry is removed). Without the reference installed the
tests skip locally and fail under CI=true; `scripts/test` installs it into `.venv-ref`.

Alone: `.venv/bin/python -m pytest -q tests/differential`; every difference, accepted or not:
`.venv/bin/python -m tests.differential.run`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.differential.accepted import ACCEPTED, classify
from tests.differential.compare import Difference
from tests.differential.harness import start_reference, start_threadline
from tests.differential.sessions import SESSIONS, differences, run_session

# Both servers as real processes. The first test's bound covers the module fixture: two servers started (up to
# 120 s each on a slow machine) and every session run.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


async def _record(reference: str, threadline: str) -> dict[str, list[Difference]]:
    async def both(name: str) -> list[Difference]:
        ref, tl = await asyncio.gather(run_session(name, reference), run_session(name, threadline))
        return differences(name, ref, tl)
    found = await asyncio.gather(*(both(name) for name in SESSIONS))
    return dict(zip(SESSIONS, found, strict=True))


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[Difference]]]:
    """Every session's differences (all sessions run once, concurrently, for the whole module)."""
    workdir = Path(tmp_path_factory.mktemp("differential"))
    started = time.monotonic()
    reference = start_reference(workdir)
    try:
        threadline = start_threadline(workdir)
    except BaseException:
        reference.stop()
        raise
    try:
        booted = time.monotonic()
        yield asyncio.run(_record(reference.url, threadline.url))
        print(f"\ndifferential: servers up in {booted - started:.1f} s, {len(SESSIONS)} sessions in "
              f"{time.monotonic() - booted:.1f} s")
    finally:
        reference.stop()
        threadline.stop()


@pytest.mark.parametrize("name", list(SESSIONS))
def test_session_answers_as_the_reference(found: dict[str, list[Difference]], name: str) -> None:
    unexplained = [d for d in found[name] if classify(d) is None]
    assert not unexplained, "differences not in tests/differential/accepted.py:\n" + "\n".join(map(str, unexplained))


def test_every_accepted_difference_is_still_seen(found: dict[str, list[Difference]]) -> None:
    seen = {entry.key for diffs in found.values() for d in diffs if (entry := classify(d))}
    stale = [f"{e.key} ({e.status}): {e.reason}" for e in ACCEPTED if e.key not in seen and not e.sometimes]
    assert not stale, ("accepted differences no longer seen (fixed? remove them from tests/differential/"
                       "accepted.py and regenerate docs/compatibility.md):\n" + "\n".join(stale))
