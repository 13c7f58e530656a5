"""MCP at /mcp: the real `mcp` client over a live server, and the transport's edges over raw HTTP.

The module's tests share one started app per backend (tests/shared_app.py), over uvicorn as `live_url` too: each
starts with the graphs' own assistants only (`http` and `live_url` below delete those earlier tests made), so a
test may count the tools.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from tests.conftest import PROJECT
from tests.shared_app import shared_app
from tests.waits import agent_stopped, logged, until
from threadline.api.mcp import PAGE_SIZE, simplify_schema, tool_name
from threadline.core.runtime import Runtime

SYSTEM = len(json.loads(PROJECT.read_text())["graphs"])  # one system assistant per graph

MCP_HEADERS = {"Accept": "application/json, text/event-stream"}

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the mark above reaches the one plain function too (test_tool_names_and_message_schemas)
              pytest.mark.filterwarnings("ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async")]

backend, served = shared_app()[:2]  # `http` and `live_url` below


@pytest_asyncio.fixture(loop_scope="module")
async def http(module_http: httpx.AsyncClient) -> httpx.AsyncClient:
    """The shared app's client, with the graphs' own assistants only."""
    await only_system_assistants(module_http)
    return module_http


@pytest_asyncio.fixture(loop_scope="module")
async def live_url(module_http: httpx.AsyncClient, module_live_url: str) -> str:
    """The shared app over uvicorn, with the graphs' own assistants only."""
    await only_system_assistants(module_http)
    return module_live_url


async def only_system_assistants(http: httpx.AsyncClient) -> None:
    """Delete the assistants earlier tests made, through the API (the graphs' own are kept)."""
    made = [a for a in (await http.post("/assistants/search", json={"limit": 1000})).json()
            if (a.get("metadata") or {}).get("created_by") != "system"]
    for assistant in made:
        assert (await http.delete(f"/assistants/{assistant['assistant_id']}")).status_code in (200, 204)
    assert len((await http.post("/assistants/search", json={"limit": 1000})).json()) == SYSTEM




async def _create_assistants(base: str, count: int) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for i in range(count):
            r = await client.post("/assistants", json={"graph_id": "counter", "name": f"helper {i:03d}",
                                                      "description": f"Counter helper number {i}"})
            assert r.status_code == 200, r.text


async def test_real_client_auto_mode_falls_back_to_the_handshake(live_url: str) -> None:
    """`mcp.Client` first probes `server/discover` (2026-07-28); our -32601 sends it to `initialize`."""
    async with Client(f"{live_url}/mcp") as client:
        tools = (await client.list_tools()).tools
        assert "counter" in {t.name for t in tools}
        result = await client.call_tool("counter", {"increment": 2})
        assert not result.is_error and json.loads(_text(result))["count"] == 2


def _text(result: CallToolResult) -> str:
    """The text of a tool result's first content block (every tool here answers with text)."""
    block = result.content[0]
    assert isinstance(block, TextContent), block
    return block.text


# --- the transport's edges, over raw HTTP in-process ----------------------------------------------

async def _rpc(http: httpx.AsyncClient, method: str, params: Any = None, *, id: Any = 1,
               headers: dict[str, str] | None = None) -> httpx.Response:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        body["params"] = params
    return await http.post("/mcp", json=body, headers=headers or MCP_HEADERS)


async def test_initialize_negotiates_the_version(http: httpx.AsyncClient) -> None:
    hello = {"capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    r = await _rpc(http, "initialize", {"protocolVersion": "2099-01-01", **hello})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in r.headers
    body = r.json()
    assert body["id"] == 1 and body["result"]["protocolVersion"] == "2025-11-25"
    assert body["result"]["capabilities"] == {"tools": {"listChanged": False}}
    older = (await _rpc(http, "initialize", {"protocolVersion": "2025-03-26", **hello}, id="a")).json()
    assert older["id"] == "a" and older["result"]["protocolVersion"] == "2025-03-26"
    assert (await _rpc(http, "ping")).json() == {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_notifications_and_responses_get_202(http: httpx.AsyncClient) -> None:
    r = await http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=MCP_HEADERS)
    assert r.status_code == 202 and r.content == b""
    r = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 9, "result": {}}, headers=MCP_HEADERS)
    assert r.status_code == 202 and r.content == b""


async def test_method_and_param_errors_are_jsonrpc_errors_in_200(http: httpx.AsyncClient) -> None:
    cases = [
        ("server/discover", None, -32601),
        ("resources/list", {}, -32601),
        ("tools/call", {"arguments": {}}, -32602),            # no name
        ("tools/call", {"name": "no_such_tool"}, -32602),
        ("tools/call", ["echo"], -32602),                      # params must be an object
        ("tools/list", {"cursor": "not-a-cursor"}, -32602),
        ("initialize", {"protocolVersion": 2025}, -32602),
    ]
    for method, params, code in cases:
        r = await _rpc(http, method, params, id=7)
        assert r.status_code == 200, (method, r.text)
        body = r.json()
        assert body["id"] == 7 and body["error"]["code"] == code, (method, body)
    unknown = (await _rpc(http, "tools/call", {"name": "no_such_tool"})).json()
    assert unknown["error"]["message"] == "Unknown tool: no_such_tool"


async def test_framing_errors_are_400_with_a_jsonrpc_body(http: httpx.AsyncClient) -> None:
    cases = [
        (b"{not json", -32700, None),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600, None),  # batches are refused
        (b'"ping"', -32600, None),
        (b'{"jsonrpc": "1.0", "id": 3, "method": "ping"}', -32600, 3),
        (b'{"jsonrpc": "2.0", "id": 4}', -32600, 4),  # neither a method nor a result
    ]
    for raw, code, rid in cases:
        r = await http.post("/mcp", content=raw, headers={**MCP_HEADERS, "content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
        assert r.json()["error"]["code"] == code and r.json()["id"] == rid, (raw, r.json())
    r = await _rpc(http, "ping", headers={"Accept": "text/html"})
    assert r.status_code == 400 and r.json()["error"]["code"] == -32600


async def test_other_http_methods(http: httpx.AsyncClient) -> None:
    got = await http.get("/mcp")
    assert got.status_code == 405 and "POST" in got.headers["allow"]  # no server-initiated stream
    r = await http.delete("/mcp")
    assert r.status_code == 204 and r.content == b""  # no session to end: a no-op
    r = await http.post("/mcp/", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=MCP_HEADERS)
    assert r.status_code == 200 and r.json()["result"] == {}


async def test_duplicate_tool_names_keep_the_oldest(http: httpx.AsyncClient) -> None:
    first = (await http.post("/assistants", json={"graph_id": "counter", "name": "twin  agent!"})).json()
    await http.post("/assistants", json={"graph_id": "echo", "name": "twin agent"})
    tools = (await _rpc(http, "tools/list")).json()["result"]["tools"]
    twins = [t for t in tools if t["name"] == "twin_agent"]
    assert len(twins) == 1 and twins[0]["title"] == first["name"]
    assert "nextCursor" not in (await _rpc(http, "tools/list")).json()["result"]  # one page only


def test_tool_names_and_message_schemas() -> None:
    assert tool_name("  my  agent\tv2 (beta) ") == "my_agent_v2_beta"
    assert len(tool_name("x" * 300)) == 128
    schema: dict[str, Any] = {"type": "object", "properties": {
        "messages": {"type": "array", "title": "Messages", "items": {"anyOf": [{"$ref": "#/$defs/HumanMessage"}]}},
        "n": {"type": "integer"}}, "$defs": {"HumanMessage": {"type": "object"}, "Other": {"type": "object"}}}
    simple = simplify_schema(schema)
    assert simple["properties"]["messages"]["type"] == "string" and simple["properties"]["n"] == {"type": "integer"}
    assert simple["$defs"] == {"Other": {"type": "object"}}
    assert schema["properties"]["messages"]["type"] == "array"  # the input is not modified


async def test_never_a_500(http: httpx.AsyncClient) -> None:
    weird: list[Any] = [None, 1, [], {}, {"jsonrpc": "2.0"}, {"jsonrpc": "2.0", "id": {}, "method": "ping"},
                        {"jsonrpc": "2.0", "id": 1, "method": 5}, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                                  "params": {"name": "echo", "arguments": "x"}},
                        {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"cursor": 5}}]
    for body in weird:
        r = await http.post("/mcp", content=json.dumps(body), headers={**MCP_HEADERS,
                                                                         "content-type": "application/json"})
        assert r.status_code < 500, (body, r.text)
        if r.status_code != 202:
            assert "error" in r.json(), (body, r.text)


async def test_a_client_that_leaves_a_tool_call_stops_its_run(live_url: str, runtime: Runtime) -> None:
    """tools/call runs the agent for as long as its client waits: one that leaves cancels the run, and the
    agent does no further work."""
    from tests.project.agents import WORK_LOG

    async with httpx.AsyncClient(base_url=live_url, timeout=30) as http:
        tools = (await _rpc(http, "tools/list", {})).json()["result"]["tools"]
        slow = next(t["name"] for t in tools if t["name"].startswith("slow"))
        calling = asyncio.create_task(_rpc(http, "tools/call", {
            "name": slow, "arguments": {"tag": "mcpleft", "steps": 200, "delay": 0.02}}))
        await until(logged(WORK_LOG, "mcpleft:"))
        calling.cancel()  # the client goes away mid-call
        with pytest.raises(asyncio.CancelledError):
            await calling
        [run] = await runtime.storage.search_runs(thread_id=None, assistant_id=None, status=None,
                                                  metadata=None, limit=1, offset=0)  # the newest: the call's
        assert run["kwargs"]["input"]["tag"] == "mcpleft"

        async def ended() -> bool:  # the cancel reaches the run at its next await
            found = await runtime.storage.get_run(run["run_id"])
            return found is None or found["status"] not in ("pending", "running")

        await until(ended, what="the left tool call's run to end")
        done = sum(w.startswith("mcpleft:") for w in WORK_LOG)
        await agent_stopped("mcpleft")  # and no work after it ended
        assert sum(w.startswith("mcpleft:") for w in WORK_LOG) == done < 200


# Last in the module: the assistants it makes would otherwise be deleted before each test that follows.
async def test_real_client_lists_tools_across_pages_and_calls_them(live_url: str) -> None:
    await _create_assistants(live_url, PAGE_SIZE + 5)  # with the system assistants: two pages
    async with streamable_http_client(f"{live_url}/mcp") as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert init.protocol_version == "2025-11-25"
        assert init.server_info.name == "Threadline" and init.capabilities.tools is not None

        first = await session.list_tools()
        assert len(first.tools) == PAGE_SIZE and isinstance(first.next_cursor, str)
        from mcp_types import PaginatedRequestParams

        second = await session.list_tools(params=PaginatedRequestParams(cursor=first.next_cursor))
        assert second.next_cursor is None
        tools = {t.name: t for t in [*first.tools, *second.tools]}
        assert len(tools) == len(first.tools) + len(second.tools) == PAGE_SIZE + 5 + SYSTEM  # no tool twice
        helper = tools["helper_042"]
        assert helper.title == "helper 042" and helper.description == "Counter helper number 42"
        assert helper.input_schema["type"] == "object" and "increment" in helper.input_schema["properties"]
        echo = tools["echo"]
        assert echo.description == "Tool based on the echo assistant"
        assert echo.input_schema["properties"]["messages"]["type"] == "string"

        done = await session.call_tool("echo", {"messages": "hello"})
        assert not done.is_error and done.content[0].type == "text"
        state = json.loads(done.content[0].text)
        assert state["messages"][-1]["content"] == "You said: hello"
        assert done.structured_content == state

        counted = await session.call_tool("helper_007", {"increment": 3})
        assert not counted.is_error and counted.structured_content["count"] == 3

        failed = await session.call_tool("failing", {"reason": "no luck"})
        assert failed.is_error and "no luck" in _text(failed)

        with pytest.raises(MCPError) as unknown:
            await session.call_tool("no_such_tool", {})
        assert unknown.value.code == -32602 and "Unknown tool" in unknown.value.message
