from __future__ import annotations

import json
import uuid

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from tests.shared_app import shared_app

# The module's tests share one started app per backend (tests/conftest.py, `module_served`): each reads what it
# made, or the system assistants, which no test changes. They run in the app's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http = shared_app()


def system_id(graph_id: str) -> str:
    return str(uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), graph_id))


async def test_system_assistants_have_deterministic_ids(sdk: LangGraphClient) -> None:
    found = await sdk.assistants.search(graph_id="echo", metadata={"created_by": "system"})
    assert [a["assistant_id"] for a in found] == [system_id("echo")]
    assert found[0]["metadata"] == {"created_by": "system"}
    assert found[0]["name"] == "echo" and found[0]["version"] == 1


async def test_get_by_graph_id_and_by_uuid(sdk: LangGraphClient) -> None:
    by_graph = await sdk.assistants.get("counter")
    by_id = await sdk.assistants.get(system_id("counter"))
    assert by_graph == by_id


async def test_create_patch_versions_latest_delete(sdk: LangGraphClient) -> None:
    a = await sdk.assistants.create("echo", config={"tags": ["x"]}, context={"k": 1}, metadata={"team": "a"},
                                    name="mine", description="d")
    assert a["graph_id"] == "echo" and a["name"] == "mine" and a["description"] == "d"
    assert a["config"] == {"tags": ["x"], "configurable": {"k": 1}} and a["context"] == {"k": 1}
    assert a["version"] == 1
    p = await sdk.assistants.update(a["assistant_id"], metadata={"more": True}, name="renamed")
    assert p["version"] == 2 and p["name"] == "renamed" and p["metadata"] == {"team": "a", "more": True}
    versions = await sdk.assistants.get_versions(a["assistant_id"])
    assert [v["version"] for v in versions] == [2, 1]
    back = await sdk.assistants.set_latest(a["assistant_id"], 1)
    assert back["version"] == 1 and back["name"] == "mine"
    await sdk.assistants.delete(a["assistant_id"])
    with pytest.raises(httpx.HTTPStatusError) as err:
        await sdk.assistants.get(a["assistant_id"])
    assert err.value.response.status_code == 404


async def test_create_if_exists(sdk: LangGraphClient) -> None:
    aid = str(uuid.uuid4())
    await sdk.assistants.create("echo", assistant_id=aid, name="one")
    with pytest.raises(httpx.HTTPStatusError) as err:
        await sdk.assistants.create("echo", assistant_id=aid)
    assert err.value.response.status_code == 409
    same = await sdk.assistants.create("echo", assistant_id=aid, if_exists="do_nothing", name="two")
    assert same["name"] == "one"


async def test_create_unknown_graph_404(http: httpx.AsyncClient) -> None:
    r = await http.post("/assistants", json={"graph_id": "nope"})
    assert r.status_code == 404 and "nope" in r.json()["detail"]


async def test_search_and_count_for_a_graph_the_server_does_not_have_are_404(http: httpx.AsyncClient) -> None:
    """As LangGraph's server: a `graph_id` no graph has is a 404 naming the graphs, not an empty page."""
    for graph_id in ("nope", ""):
        for path in ("/assistants/search", "/assistants/count"):
            r = await http.post(path, json={"graph_id": graph_id})
            assert r.status_code == 404, (path, graph_id, r.status_code, r.text)
            assert r.json()["detail"].startswith(f"Graph '{graph_id}' not found. Expected one of: ["), r.text
    r = await http.post("/assistants/search", json={"graph_id": "echo"})
    assert r.status_code == 200 and {a["graph_id"] for a in r.json()} == {"echo"}
    assert system_id("echo") in {a["assistant_id"] for a in r.json()}


async def test_a_graph_with_langgraphs_default_name_is_named_after_its_id(http: httpx.AsyncClient) -> None:
    """As LangGraph's server: a compiled graph left named `LangGraph` takes its graph id (a factory's too), so
    schema titles and the root run of `events` mode are called after it; a graph given a name keeps it."""
    from tests.project import agents

    for graph_id, title in (("slow", "slow_state"), ("factory", "factory_state"), ("echo", "echo_state")):
        schemas = (await http.get(f"/assistants/{system_id(graph_id)}/schemas")).json()
        assert schemas["state_schema"]["title"] == title, (graph_id, schemas["state_schema"])
    assert agents.slow.name == "LangGraph"  # the project's own object is left as it is
    r = await http.post("/runs/stream", json={"assistant_id": "slow", "input": {"steps": 1, "delay": 0.01},
                                             "stream_mode": "events"})
    names = [json.loads(line[5:])["name"] for line in r.text.splitlines() if line.startswith("data:")
             and '"on_chain_start"' in line]
    assert names[0] == "slow", names


async def test_search_filters_sort_select_count(sdk: LangGraphClient) -> None:
    group = uuid.uuid4().hex  # the module's app is shared: this test's assistants are the ones in its group
    counters = await sdk.assistants.count(graph_id="counter")
    for i in range(3):
        await sdk.assistants.create("counter", metadata={"group": group, "i": i}, name=f"c{i}")
    found = await sdk.assistants.search(metadata={"group": group}, sort_by="name", sort_order="asc")
    assert [a["name"] for a in found] == ["c0", "c1", "c2"]
    page = await sdk.assistants.search(metadata={"group": group}, limit=1, offset=1, sort_by="name",
                                       sort_order="asc", select=["assistant_id", "name"])
    assert page == [{"assistant_id": page[0]["assistant_id"], "name": "c1"}]
    assert await sdk.assistants.count(metadata={"group": group}) == 3
    assert await sdk.assistants.count(graph_id="counter") == counters + 3


async def test_schemas_graph_subgraphs(sdk: LangGraphClient) -> None:
    schemas = await sdk.assistants.get_schemas("counter")
    assert schemas["graph_id"] == "counter"
    assert "increment" in schemas["input_schema"]["properties"]
    assert "count" in schemas["state_schema"]["properties"]
    drawing = await sdk.assistants.get_graph("counter")
    assert {n["id"] for n in drawing["nodes"]} >= {"__start__", "count", "__end__"}
    # As LangGraph's server draws it: a node's data is its name (no class path of the runnable behind it).
    assert next(n for n in drawing["nodes"] if n["id"] == "count") == {"id": "count", "type": "runnable",
                                                                       "data": {"name": "count"}}
    subs = await sdk.assistants.get_subgraphs("nested")
    assert "child" in subs
    xray = await sdk.assistants.get_graph("nested", xray=True)
    assert any("child_step" in n["id"] for n in xray["nodes"])


async def test_factory_graph(sdk: LangGraphClient) -> None:
    schemas = await sdk.assistants.get_schemas("factory")
    assert "items" in schemas["state_schema"]["properties"]


async def test_bad_bodies_are_422_naming_the_field(http: httpx.AsyncClient) -> None:
    r = await http.post("/assistants/search", json={"limit": -1})
    assert r.status_code == 422 and "limit" in r.json()["detail"]
    r = await http.post("/assistants", json={"graph_id": 1})
    assert r.status_code == 422 and "graph_id" in r.json()["detail"]
    r = await http.post("/assistants", json={"graph_id": "echo", "bogus": 1})  # ignored, as LangGraph's server
    assert r.status_code == 200, r.text
    r = await http.post("/assistants", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422


async def test_agents_paths(http: httpx.AsyncClient) -> None:
    agents = (await http.post("/agents/search", json={"limit": 100})).json()
    assert {a["name"] for a in agents} >= {"echo", "counter"}
    one = (await http.get(f"/agents/{system_id('echo')}")).json()
    assert one["agent_id"] == system_id("echo") and one["name"] == "echo"
    schemas = (await http.get(f"/agents/{system_id('counter')}/schemas")).json()
    assert schemas["agent_id"] == system_id("counter") and "properties" in schemas["input_schema"]
    assert (await http.get("/agents/missing")).status_code == 404


async def test_context_and_configurable_mirror(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    a = await sdk.assistants.create("echo", context={"a": 1}, config={"tags": ["t"]})
    assert a["context"] == {"a": 1} and a["config"] == {"tags": ["t"], "configurable": {"a": 1}}
    b = await sdk.assistants.create("echo", config={"configurable": {"q": 2}})
    assert b["context"] == {"q": 2}
    r = await http.post("/assistants", json={"graph_id": "echo", "context": {"a": 1},
                                             "config": {"configurable": {"b": 2}}})
    assert r.status_code == 400 and "context" in r.json()["detail"]


async def test_search_pagination_headers(http: httpx.AsyncClient) -> None:
    r = await http.post("/assistants/search", json={"limit": 2})
    assert len(r.json()) == 2
    assert r.headers["x-pagination-next"] == "2" and r.headers["x-pagination-total"] == "3"
    last = await http.post("/assistants/search", json={"limit": 100})
    assert "x-pagination-next" not in last.headers
    assert last.headers["x-pagination-total"] == str(len(last.json()))
