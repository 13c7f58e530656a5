"""The layers point one way (docs/architecture.md, "Layers"): api → core → storage / broker, with leaves anyone
may import. Checked on the source, so a new module that breaks the rule fails here, not in review."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "threadline"
LEAVES = ("errors", "shapes", "serde", "ids")
WEB = ("fastapi", "starlette", "sse_starlette", "uvicorn")
DRIVERS = ("psycopg", "psycopg_pool", "aiosqlite", "sqlite3", "redis")
# Which imports each part may not make (a prefix of the imported module's name).
FORBIDDEN = {
    "core": ("threadline.api", *WEB, *DRIVERS),
    "storage": ("threadline.api", "threadline.core", *WEB),
    "broker": ("threadline.api", "threadline.core", "threadline.storage", *WEB),
    # The web console reads only through the HTTP API, called in-process (`ui/client.py`).
    "ui": ("threadline.core", "threadline.storage", "threadline.broker", *DRIVERS),
}
JSON_RPC_CODE = re.compile(r"-32[0-7]\d\d\b")


def _modules(part: str) -> list[Path]:
    if part in LEAVES:
        return [PACKAGE / f"{part}.py"]
    return sorted((PACKAGE / part).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _breaks(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("part", [*FORBIDDEN, *LEAVES])
def test_imports_point_one_way(part: str) -> None:
    forbidden = FORBIDDEN.get(part, ("threadline",))  # a leaf imports nothing of Threadline's
    wrong = {f"{path.relative_to(PACKAGE)}: {name}" for path in _modules(part) for name in _imports(path)
             if _breaks(name, forbidden)}
    assert not wrong


def test_the_core_speaks_no_wire() -> None:
    """JSON-RPC codes and protocol envelopes are the API adapters' (`api/errors.py`, `api/protocol.py`)."""
    wrong = [f"{path.relative_to(PACKAGE)}:{n}" for path in _modules("core")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if JSON_RPC_CODE.search(line) or '"type": "error"' in line]
    assert not wrong


def test_tracing_is_a_leaf_with_its_implementation() -> None:
    """`tracing.py` (the interface the API and the core call) and `otel.py` (the OpenTelemetry one, loaded only
    when configured) import nothing of Threadline's but each other."""
    pairs = (("tracing", "threadline.otel"), ("otel", "threadline.tracing"))
    wrong = {f"{name}.py: {imported}" for name, allowed in pairs
             for imported in _imports(PACKAGE / f"{name}.py")
             if _breaks(imported, ("threadline",)) and imported != allowed}
    assert not wrong
