"""What a process serving no A2A, MCP or console page never imports (issue 24: RSS at rest). A started app, in a
fresh interpreter (this test process has imported everything already): the A2A SDK and protobuf, MCP's types and
Jinja2 are not in `sys.modules` until the first call that needs them, and that call is then answered as ever."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from threadline.core.assistants import system_assistant_id

PROJECT = Path(__file__).parent / "project" / "langgraph.json"
pytestmark = pytest.mark.e2e  # a fresh interpreter: this process has imported all of it

LAZY = ("a2a", "google.protobuf", "mcp_types", "jinja2", "opentelemetry.exporter", "threadline.otel")

SCRIPT = """
import asyncio, json, sys
import httpx
from asgi_lifespan import LifespanManager
from threadline.api.app import create_app
from threadline.settings import Settings

LAZY = %(lazy)r

def loaded():
    return sorted(w for w in LAZY if any(n == w or n.startswith(w + ".") for n in sys.modules))

async def main():
    app = create_app(Settings(config=%(config)r, database_url=%(db)r, workers=1))
    out = {}
    async with LifespanManager(app, startup_timeout=60, shutdown_timeout=30):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as http:
            out["ok"] = (await http.get("/ok")).status_code
            out["openapi"] = sorted(p for p in (await http.get("/openapi.json")).json()["paths"]
                                    if p.startswith(("/a2a", "/mcp")))
            out["at_rest"] = loaded()
            card = await http.get("/a2a/%(echo)s")
            out["card"] = [card.status_code, card.json().get("name")]
            out["after_card"] = loaded()
            sent = await http.post("/a2a/%(echo)s", headers={"Accept": "application/json"}, json={
                "jsonrpc": "2.0", "id": 1, "method": "message/send",
                "params": {"message": {"kind": "message", "messageId": "m1", "role": "user",
                                       "parts": [{"kind": "text", "text": "hello"}]}}})
            out["a2a"] = [sent.status_code, sent.json().get("result", {}).get("status", {}).get("state")]
            wrong = await http.post("/a2a/%(echo)s", headers={"Accept": "application/json"},
                                    json={"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": 7}})
            out["a2a_error"] = [wrong.status_code, wrong.json()["error"]["code"]]
            mcp = await http.post("/mcp", headers={"Accept": "application/json, text/event-stream"},
                                  json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
            out["mcp"] = [mcp.status_code, len(mcp.json()["result"]["tools"]) > 0]
            out["after_all"] = loaded()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_a2a_mcp_and_the_console_templates_load_at_first_use(tmp_path: Path) -> None:
    script = SCRIPT % {"lazy": LAZY, "config": str(PROJECT), "db": f"sqlite:///{tmp_path / 'lazy.db'}",
                       "echo": system_assistant_id("echo")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100,
                          cwd=tmp_path, env={"LANGSMITH_TRACING": "false", "PATH": "/usr/bin:/bin",
                                             "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ok"] == 200
    assert "/a2a/{assistant_id}" in out["openapi"] and "/mcp" in out["openapi"]  # the routes are there, unloaded
    assert out["at_rest"] == []
    assert out["card"] == [200, "echo"]
    assert out["a2a"] == [200, "completed"]
    assert out["a2a_error"] == [200, -32602]  # a bad param: mapped as ever (api/errors.py)
    assert out["mcp"] == [200, True]
    assert {"a2a", "google.protobuf", "mcp_types"} <= set(out["after_all"])
    assert "opentelemetry.exporter" not in out["after_all"]  # no OTEL_* set: no exporter, ever


WORKER = """
import asyncio, json, sys
from threadline import cli
from threadline.core.runtime import Runtime
from threadline.heap import startup_frozen
from threadline.settings import Settings
from threadline.shutdown import Stop, without_stuck_threads

async def main():
    runtime = await Runtime.open(Settings(config=%(config)r, database_url=%(db)r, workers=1))
    try:
        await runtime.start()
    finally:
        await runtime.close()

cli.run_loop(main())
print(json.dumps(sorted({n.split(".")[0] if not n.startswith("threadline.") else n for n in sys.modules})))
"""


def test_a_worker_imports_no_http_server_nor_api(tmp_path: Path) -> None:
    """What `threadline worker` imports (`cli.work`: the CLI, a runtime opened and started) holds no HTTP server,
    no web framework and nothing of the API's surfaces."""
    script = WORKER % {"config": str(PROJECT), "db": f"sqlite:///{tmp_path / 'worker.db'}"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100,
                          cwd=tmp_path, env={"LANGSMITH_TRACING": "false", "PATH": "/usr/bin:/bin",
                                             "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "threadline.core.runtime" in loaded  # (what the check reads is the worker's imports)
    wrong = loaded & {"uvicorn", "watchfiles", "fastapi", "a2a", "mcp_types", "jinja2", "threadline.server",
                      "threadline.api", "threadline.ui"}
    assert not wrong
