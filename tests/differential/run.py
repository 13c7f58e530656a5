"""Run every differential session against both servers and print the differences (a tool for people).

    .venv/bin/python -m tests.differential.run [--show] [--repeat N] [session-name-prefix ...]

`--show` also prints each exchange of each session, as recorded (masked), on both servers. `--repeat N` runs
the sessions N rounds in a row on the same two servers (each round all of them concurrently, as the test does)
and prints, per session, the rounds with a difference `accepted.py` does not explain (with `--show`, and
the exchanges of those sessions): the check that a session
does not depend on timing (run it beside a CPU hog to see it under load).

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
    return dict(zip(names, results, strict=True))


def repeat(names: list[str], rounds: int, show: bool = False) -> int:
    """Run the sessions `rounds` times, each round on two fresh servers (as the test does: sessions tag what
    they make, so a second round on the same servers would find the first's); print every unexplained
    difference; return the number of session failures."""
    failed: dict[str, int] = {}
    for round_ in range(1, rounds + 1):
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            ref, tl = start_reference(Path(tmp)), start_threadline(Path(tmp))
            try:
                recordings = asyncio.run(record_all(names, ref.url, tl.url))
            finally:
                ref.stop()
                tl.stop()
        bad = 0
        for name, (r, t) in recordings.items():
            new = [d for d in differences(name, r, t) if classify(d) is None]
            for diff in new:
                print(f"round {round_}: NEW {diff}")
            for label, recorded in (("reference", r), ("threadline", t)) if new and show else ():
                print(f"round {round_}: == {name} on {label}"
                      + (f" (error: {recorded.error})" if recorded.error else ""))
                for e in recorded.exchanges:
                    print(f"round {round_}:    {e.step}: {e.where} {e.status} {e.body}")
            if new:
                failed[name] = failed.get(name, 0) + 1
                bad += 1
        print(f"round {round_}/{rounds}: {len(names)} sessions in {time.monotonic() - started:.1f} s "
              f"(servers started included), {bad} with an unexplained difference", flush=True)
    for name, count in sorted(failed.items()):
        print(f"{name}: failed {count} of {rounds} rounds")
    print(f"{rounds} rounds of {len(names)} sessions: {sum(failed.values())} session failures")
    return sum(failed.values())


def main() -> None:
    show = "--show" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--show"]
    rounds = 0
    if "--repeat" in args:
        at = args.index("--repeat")
        rounds = int(args[at + 1])
        del args[at:at + 2]
    prefixes = args
    names = [n for n in SESSIONS if not prefixes or n.startswith(tuple(prefixes))]
    if rounds:
        sys.exit(1 if repeat(names, rounds, show) else 0)
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
