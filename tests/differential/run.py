"""Run every differential session against both servers and print the differences (a tool for people).

    .venv/bin/python -m tests.differential.run [--show] [session-name-prefix ...]

`--show` also prints each exchange of each session, as recorded (masked), on both servers.

The test (`tests/differential/test_differential.py`) does the same and fails on any difference that
`accepted.py` does not list; this prints them all, accepted or not, with the time it took.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from tests.differential.accepted import classify
from tests.differential.harness import start_reference, start_threadline
from tests.differential.sessions import SESSIONS, differences, run_session


async def record_all(names: list[str], reference: str, threadline: str) -> dict[str, tuple]:
    async def both(name: str) -> tuple:
        return await asyncio.gather(run_session(name, reference), run_session(name, threadline))
    results = await asyncio.gather(*(both(n) for n in names))
    return dict(zip(names, results))


def main() -> None:
    show = "--show" in sys.argv
    prefixes = [a for a in sys.argv[1:] if a != "--show"]
    names = [n for n in SESSIONS if not prefixes or n.startswith(tuple(prefixes))]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        ref, tl = start_reference(Path(tmp)), start_threadline(Path(tmp))
        booted = time.monotonic()
        try:
            recordings = asyncio.run(record_all(names, ref.url, tl.url))
        finally:
            ref.stop()
            tl.stop()
        ran = time.monotonic()
    for name, (r, t) in recordings.items():
        for label, s in (("reference", r), ("threadline", t)) if show else ():
            print(f"== {name} on {label}" + (f" (error: {s.error})" if s.error else ""))
            for e in s.exchanges:
                print(f"   {e.step}: {e.where} {e.status} {str(e.body)[:240]}")
        diffs = differences(name, r, t)
        for diff in diffs:
            entry = classify(diff)
            print(f"{'ok  ' if entry else 'NEW '}{diff}" + (f"  <- {entry.key}" if entry else ""))
    print(f"{len(names)} sessions; servers up in {booted - started:.1f} s, sessions ran in {ran - booted:.1f} s")


if __name__ == "__main__":
    main()
