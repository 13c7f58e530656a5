#!/usr/bin/env python
"""What bundling langgraph.json's `ui` costs at startup: `threadline serve` on tests/frontend/project, from launch
to its banner, with the components bundled (LangGraph's bundler as the front-end build installed it:
`python -m tests.environments`) against `--ui-bundler off`, alternated, each start in a fresh copy.

    python bench/ui_bundle.py [rounds]      # 6 by default"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.environments import frontend_build  # noqa: E402
from tests.processes import clean_env, stop, threadline_cmd  # noqa: E402

PROJECT = ROOT / "tests" / "frontend" / "project"


def startup_seconds(bundler: str) -> float:
    folder = Path(tempfile.mkdtemp())
    try:
        shutil.copytree(PROJECT, folder / "p", ignore=shutil.ignore_patterns(".threadline", "__pycache__"))
        began = time.monotonic()
        proc = subprocess.Popen(threadline_cmd("serve", "--port", "0", "--ui-bundler", bundler), cwd=folder / "p",
                                env=clean_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        for line in proc.stdout:
            if re.search("listening on", line):
                break
        else:
            raise SystemExit(f"no banner with --ui-bundler {bundler}")
        took = time.monotonic() - began
        stop(proc)
        return took
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(rounds: int) -> None:
    bundler = str(frontend_build() / "node_modules" / ".bin" / "langgraphjs-ui")
    times: dict[str, list[float]] = {"bundled": [], "off": []}
    for i in range(rounds):
        order = [("bundled", bundler), ("off", "off")]
        for label, value in order if i % 2 == 0 else reversed(order):
            times[label].append(startup_seconds(value))
    for label, values in times.items():
        print(f"{label:8} median {statistics.median(values):.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"bundled / off: {statistics.median(times['bundled']) / statistics.median(times['off']):.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
