"""Fuzzing the HTTP API from its own OpenAPI document: schemathesis generates requests for every operation
of `/openapi.json` and sends them to the app in-process (ASGI, its lifespan started once); any 5xx is a
finding. `tests/test_fuzz.py` runs a short pass; a longer one, by hand:

    .venv/bin/python -m tests.fuzz --seconds 600 --database-url postgresql://postgres@127.0.0.1:5432/fuzz \
        --redis-url redis://127.0.0.1:6379/0

(a database of its own: the run fills it with whatever it generated).
"""

from __future__ import annotations

import argparse
import collections
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from threadline.api.app import create_app
from threadline.settings import Settings


@dataclass
class Figures:
    operations: int = 0
    exercised: set[tuple[str, str]] = field(default_factory=set)
    cases: int = 0
    slow: int = 0
    server_errors: collections.Counter[tuple[str, str, int]] = field(default_factory=collections.Counter)
    examples: dict[tuple[str, str, int], str] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        lines = [f"operations {self.operations}, exercised {len(self.exercised)}, cases {self.cases}, "
                 f"server errors {sum(self.server_errors.values())}, no answer within {TIMEOUT} s {self.slow}, "
                 f"{self.seconds:.0f} s"]
        lines += [f"  {n} x {k[0]} {k[1]} -> {k[2]}: {self.examples[k]}" for k, n in self.server_errors.most_common()]
        return "\n".join(lines)


def fuzz(settings: Settings, seconds: float) -> Figures:
    """Round after round over every operation, one generated case each, until `seconds` have passed; the first
    round always completes, so a slow machine exercises every operation once however long that takes."""
    import schemathesis
    from schemathesis.core.result import Err
    from schemathesis.python.asgi import shutdown_lifespans

    app = create_app(settings)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()  # an operation its own document does not describe: the document is wrong
        operations.append(result.ok())
    figures = Figures(operations=len(operations))
    start = time.monotonic()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hypothesis: `.example()` is meant for exploration, as here
            rounds = 0
            while rounds == 0 or time.monotonic() - start < seconds:
                for operation in operations:
                    if rounds and time.monotonic() - start >= seconds:
                        break
                    _one(operation, figures)
                rounds += 1
    finally:
        shutdown_lifespans()
    figures.seconds = time.monotonic() - start
    return figures


#: Seconds a generated request may take. A wait for a run generated to start decades from now
#: (`after_seconds`), or a stream, legitimately answers later: counted as `slow`, not as an error.
TIMEOUT = 5


def _one(operation: Any, figures: Figures) -> None:
    case = operation.as_strategy().example()
    figures.cases += 1
    try:
        response = case.call(timeout=TIMEOUT)
    except Exception as exc:
        if "Timeout" not in type(exc).__name__:
            raise
        figures.slow += 1
        return
    figures.exercised.add((operation.method.upper(), operation.path))
    if response.status_code >= 500:
        key = (operation.method.upper(), operation.path, response.status_code)
        figures.server_errors[key] += 1
        figures.examples.setdefault(key, f"path {case.path_parameters} query {case.query} body "
                                         f"{str(case.body)[:200]} -> {response.text[:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--database-url", default="sqlite:///.threadline/fuzz.db")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--redis-key-prefix", default="threadline-fuzz",
                        help="keys of its own on a Redis that other servers may share")
    args = parser.parse_args()
    from tests.conftest import PROJECT

    settings = Settings(config=str(PROJECT), workers=2, database_url=args.database_url, redis_url=args.redis_url,
                        redis_key_prefix=args.redis_key_prefix)
    figures = fuzz(settings, args.seconds)
    print(figures.summary())
    raise SystemExit(1 if figures.server_errors else 0)


if __name__ == "__main__":
    main()
