"""The long-term store: /store/items (put, get, delete, search) and /store/namespaces.

Through langgraph-sdk where it has a method; raw HTTP for what the sdk cannot send (bad inputs).
Semantic search runs against a second app whose project configures `store.index` with a fake embedding,
on each backend; PostgreSQL's exact scan (no pgvector) is also tested on its own, pgvector or not.

The plain project's tests share one started app per backend (tests/shared_app.py): each starts from an empty
store (`http` below deletes what the test before it left), so a test may still count and list everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from tests.conftest import BACKENDS, fresh_backend
from tests.services import Backend, ScaleOut
from tests.shared_app import shared_app
from threadline.api.app import create_app
from threadline.loader import resolve_store_index
from threadline.settings import Settings
from threadline.storage import open_storage
from threadline.storage.vectors import ExactScanStore

PLAIN_PROJECT = Path(__file__).parent / "project" / "langgraph.json"
STORE_PROJECT = Path(__file__).parent / "project" / "store_index" / "langgraph.json"
TTL_PROJECT = STORE_PROJECT.with_name("ttl.json")
FILE_EMBED_PROJECT = STORE_PROJECT.with_name("file_embed.json")
# Semantic search in LangGraph's SQLite store needs the sqlite-vec extension, so a Python whose sqlite3
# can load extensions (pyenv builds often cannot). PostgreSQL needs nothing: pgvector, or an exact scan.
CAN_LOAD_EXTENSIONS = hasattr(sqlite3.Connection, "enable_load_extension")

pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served = shared_app()[:2]  # `http` below


@pytest_asyncio.fixture(loop_scope="module")
async def http(module_http: httpx.AsyncClient) -> httpx.AsyncClient:
    """The shared app's client, its store emptied of what earlier tests put there."""
    await empty_store(module_http)
    return module_http


async def empty_store(http: httpx.AsyncClient) -> None:
    """Delete every item through the API, as a user would (search lists at most 1,000 at a time)."""
    search = {"namespace_prefix": [], "limit": 1000}
    while items := (await http.post("/store/items/search", json=search)).json()["items"]:
        for item in items:
            where = {"namespace": item["namespace"], "key": item["key"]}
            assert (await http.request("DELETE", "/store/items", json=where)).status_code == 204
    assert (await http.post("/store/namespaces", json={})).json()["namespaces"] == []


def ts(value: str | datetime) -> datetime:
    assert isinstance(value, str), value  # the JSON's ISO string (the SDK annotates it datetime, never parsed)
    parsed = datetime.fromisoformat(value)
    assert parsed.tzinfo is not None, value
    return parsed


def assert_json_error(resp: httpx.Response, status: int, field: str) -> dict[str, Any]:
    """An error the Agent Protocol way: JSON with detail/code/message, naming the offending field."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert {"detail", "code", "message"} <= set(body), body
    assert body["detail"] == body["message"]
    assert field in body["detail"], body
    return body


async def seed(sdk: LangGraphClient) -> None:
    """Items in a small tree: a.b/k, a.b/k5, a.c/k2, a.b.d/k3, z/k4."""
    await sdk.store.put_item(["a", "b"], "k", {"n": 1, "color": "red"})
    await sdk.store.put_item(["a", "b"], "k5", {"n": 5, "color": "blue"})
    await sdk.store.put_item(["a", "c"], "k2", {"n": 2, "color": "red"})
    await sdk.store.put_item(["a", "b", "d"], "k3", {"n": 3, "color": "green"})
    await sdk.store.put_item(["z"], "k4", {"n": 4, "color": "red"})


def keys(result: Mapping[str, Any]) -> list[str]:
    return [item["key"] for item in result["items"]]


# --- put / get / delete -------------------------------------------------------------------------------------------


async def test_put_then_get_returns_the_item(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    resp = await http.put("/store/items",
                          json={"namespace": ["users", "u1"], "key": "prefs", "value": {"theme": "dark"}})
    assert resp.status_code == 204
    assert resp.content == b""

    item = await sdk.store.get_item(["users", "u1"], "prefs")
    assert item["namespace"] == ["users", "u1"]
    assert item["key"] == "prefs"
    assert item["value"] == {"theme": "dark"}
    assert ts(item["created_at"]) == ts(item["updated_at"])
    assert "score" not in item


async def test_get_takes_the_namespace_as_one_dotted_string(http: httpx.AsyncClient, sdk: LangGraphClient) -> None:
    await sdk.store.put_item(["a", "b", "c"], "k", {"deep": True})
    resp = await http.get("/store/items", params={"namespace": "a.b.c", "key": "k"})
    assert resp.status_code == 200
    assert resp.json()["namespace"] == ["a", "b", "c"]
    # A different level of the tree is a different namespace.
    assert (await http.get("/store/items", params={"namespace": "a.b", "key": "k"})).json() is None


async def test_overwrite_replaces_value_and_moves_updated_at(sdk: LangGraphClient, database_url: str) -> None:
    await sdk.store.put_item(["ns"], "k", {"v": 1, "old": True})
    await _age_store_items(database_url, seconds=2)  # as if written 2 s ago, without waiting for it
    first = await sdk.store.get_item(["ns"], "k")
    await sdk.store.put_item(["ns"], "k", {"v": 2})
    second = await sdk.store.get_item(["ns"], "k")

    assert second["value"] == {"v": 2}  # replaced, not merged
    assert ts(second["updated_at"]) > ts(first["updated_at"])
    found = await sdk.store.search_items(["ns"])
    assert keys(found) == ["k"]  # still one item


async def _age_store_items(database_url: str, seconds: float) -> None:
    """Move every store item's timestamps `seconds` into the past: time passing, for the store's rows."""
    if database_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=30)) as db, db:
            shift = f"-{seconds} seconds"
            db.execute("UPDATE store SET created_at = strftime('%Y-%m-%d %H:%M:%f', created_at, ?), "
                       "updated_at = strftime('%Y-%m-%d %H:%M:%f', updated_at, ?)", (shift, shift))
        return
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("UPDATE store SET created_at = created_at - make_interval(secs => %s), "
                           "updated_at = updated_at - make_interval(secs => %s)", (seconds, seconds))


async def test_missing_item_is_null_and_sdk_returns_none(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    resp = await http.get("/store/items", params={"namespace": "nobody", "key": "nothing"})
    assert resp.status_code == 200
    assert resp.json() is None
    assert await sdk.store.get_item(["nobody"], "nothing") is None


async def test_delete_then_gone(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    await sdk.store.put_item(["ns", "x"], "k", {"v": 1})
    await sdk.store.put_item(["ns", "x"], "keep", {"v": 2})
    resp = await http.request("DELETE", "/store/items", json={"namespace": ["ns", "x"], "key": "k"})
    assert resp.status_code == 204
    assert resp.content == b""

    assert await sdk.store.get_item(["ns", "x"], "k") is None
    assert (await sdk.store.get_item(["ns", "x"], "keep"))["value"] == {"v": 2}
    assert keys(await sdk.store.search_items(["ns"])) == ["keep"]


async def test_delete_through_sdk_and_deleting_a_missing_item_is_fine(sdk: LangGraphClient) -> None:
    await sdk.store.put_item(["ns"], "k", {"v": 1})
    await sdk.store.delete_item(["ns"], "k")
    assert await sdk.store.get_item(["ns"], "k") is None
    await sdk.store.delete_item(["ns"], "k")  # again: no error (204)


async def test_refresh_ttl_is_accepted_on_get(sdk: LangGraphClient) -> None:
    await sdk.store.put_item(["ns"], "k", {"v": 1}, ttl=30)
    item = await sdk.store.get_item(["ns"], "k", refresh_ttl=True)
    assert item["value"] == {"v": 1}


async def test_put_with_ttl_stores_the_item(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    resp = await http.put("/store/items", json={"namespace": ["ttl"], "key": "k", "value": {"v": 1}, "ttl": 5})
    assert resp.status_code == 204
    # ttl is in minutes, a number in the API; the SDK annotates an int, and sends what it is given.
    await sdk.store.put_item(["ttl"], "k2", {"v": 2}, ttl=0.5)  # type: ignore[arg-type]
    assert (await sdk.store.get_item(["ttl"], "k"))["value"] == {"v": 1}
    assert (await sdk.store.get_item(["ttl"], "k2"))["value"] == {"v": 2}


@pytest_asyncio.fixture(loop_scope="module")
async def ttl_sdk(tmp_path: Path) -> AsyncIterator[LangGraphClient]:
    """The app over a project whose `store.ttl` sweeps expired items every 0.3 s."""
    settings = Settings(config=str(TTL_PROJECT), database_url=f"sqlite:///{tmp_path / 'ttl.db'}", workers=0)
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://threadline", timeout=30) as client:
            yield LangGraphClient(client)


async def test_item_with_ttl_expires(ttl_sdk: LangGraphClient) -> None:
    await ttl_sdk.store.put_item(["ttl"], "short", {"v": 1}, ttl=0.005)  # type: ignore[arg-type]  # 0.3 s; SDK: int
    await ttl_sdk.store.put_item(["ttl"], "forever", {"v": 2})
    await ttl_sdk.store.put_item(["ttl"], "long", {"v": 3}, ttl=60)
    assert (await ttl_sdk.store.get_item(["ttl"], "short"))["value"] == {"v": 1}
    # The project sets `refresh_on_read`: poll with refresh_ttl=False, or every read would extend the TTL.
    for _ in range(50):  # SQLite's clock has whole seconds: allow a few
        if await ttl_sdk.store.get_item(["ttl"], "short", refresh_ttl=False) is None:
            break
        await asyncio.sleep(0.1)
    assert await ttl_sdk.store.get_item(["ttl"], "short", refresh_ttl=False) is None
    assert sorted(keys(await ttl_sdk.store.search_items(["ttl"]))) == ["forever", "long"]
    assert (await ttl_sdk.store.get_item(["ttl"], "long", refresh_ttl=True))["value"] == {"v": 3}


async def test_put_with_index_false_still_stores(sdk: LangGraphClient) -> None:
    await sdk.store.put_item(["ns"], "k", {"text": "hello"}, index=False)
    assert (await sdk.store.get_item(["ns"], "k"))["value"] == {"text": "hello"}


# --- search --------------------------------------------------------------------------------------------------------


async def test_search_by_namespace_prefix(sdk: LangGraphClient) -> None:
    await seed(sdk)
    assert sorted(keys(await sdk.store.search_items(["a"]))) == ["k", "k2", "k3", "k5"]
    assert sorted(keys(await sdk.store.search_items(["a", "b"]))) == ["k", "k3", "k5"]
    assert keys(await sdk.store.search_items(["a", "b", "d"])) == ["k3"]
    assert keys(await sdk.store.search_items(["z"])) == ["k4"]
    assert keys(await sdk.store.search_items(["nope"])) == []
    # A prefix matches whole labels, not the start of a label.
    assert keys(await sdk.store.search_items(["a", "b", "d", "e"])) == []
    await sdk.store.put_item(["ab"], "other", {"n": 9})
    assert "other" not in keys(await sdk.store.search_items(["a"]))


async def test_search_items_have_the_item_shape_and_null_score(sdk: LangGraphClient) -> None:
    await sdk.store.put_item(["s"], "k", {"v": 1})
    result = await sdk.store.search_items(["s"])
    assert set(result) == {"items"}
    (item,) = result["items"]
    assert item["namespace"] == ["s"]
    assert item["key"] == "k"
    assert item["value"] == {"v": 1}
    assert "score" in item and item["score"] is None
    ts(item["created_at"]), ts(item["updated_at"])


async def test_search_with_empty_prefix_returns_everything(sdk: LangGraphClient) -> None:
    await seed(sdk)
    assert sorted(keys(await sdk.store.search_items([]))) == ["k", "k2", "k3", "k4", "k5"]


async def test_search_without_namespace_prefix_works(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    """The reference server 500s on a body without `namespace_prefix`; we treat it as `[]`."""
    await seed(sdk)
    resp = await http.post("/store/items/search", json={})
    assert resp.status_code == 200, resp.text
    assert sorted(keys(resp.json())) == ["k", "k2", "k3", "k4", "k5"]
    resp = await http.post("/store/items/search", json={"filter": {"color": "green"}})
    assert resp.status_code == 200, resp.text
    assert keys(resp.json()) == ["k3"]


async def test_search_filter_is_equality_on_value_keys(sdk: LangGraphClient) -> None:
    await seed(sdk)
    red = await sdk.store.search_items(["a"], filter={"color": "red"})
    assert sorted(keys(red)) == ["k", "k2"]
    assert all(i["value"]["color"] == "red" for i in red["items"])
    assert keys(await sdk.store.search_items(["a"], filter={"color": "red", "n": 2})) == ["k2"]
    assert keys(await sdk.store.search_items(["a"], filter={"color": "purple"})) == []
    assert sorted(keys(await sdk.store.search_items([], filter={"color": "red"}))) == ["k", "k2", "k4"]


async def test_search_filter_comparison_operators(sdk: LangGraphClient) -> None:
    await seed(sdk)
    assert sorted(keys(await sdk.store.search_items([], filter={"n": {"$gt": 3}}))) == ["k4", "k5"]
    assert sorted(keys(await sdk.store.search_items([], filter={"n": {"$lte": 2}}))) == ["k", "k2"]


async def test_search_limit_and_offset_page_through_results(sdk: LangGraphClient) -> None:
    for i in range(7):
        await sdk.store.put_item(["page"], f"k{i}", {"i": i})
    everything = keys(await sdk.store.search_items(["page"], limit=100))
    assert sorted(everything) == [f"k{i}" for i in range(7)]

    pages = [keys(await sdk.store.search_items(["page"], limit=3, offset=off)) for off in (0, 3, 6)]
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [k for p in pages for k in p] == everything  # consistent order, no overlap, nothing lost
    assert keys(await sdk.store.search_items(["page"], limit=3, offset=7)) == []


async def test_search_default_limit_is_ten(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    for i in range(12):
        await sdk.store.put_item(["many"], f"k{i:02d}", {"i": i})
    resp = await http.post("/store/items/search", json={"namespace_prefix": ["many"]})
    assert len(resp.json()["items"]) == 10


async def test_search_query_without_an_index_is_ignored(sdk: LangGraphClient) -> None:
    await seed(sdk)
    result = await sdk.store.search_items(["a", "b"], query="anything")
    assert sorted(keys(result)) == ["k", "k3", "k5"]
    assert all(i["score"] is None for i in result["items"])


# --- namespaces ----------------------------------------------------------------------------------------------------


async def test_list_namespaces_sorted(sdk: LangGraphClient) -> None:
    await seed(sdk)
    result = await sdk.store.list_namespaces()
    assert result == {"namespaces": [["a", "b"], ["a", "b", "d"], ["a", "c"], ["z"]]}


async def test_list_namespaces_prefix_suffix(sdk: LangGraphClient) -> None:
    await seed(sdk)
    assert (await sdk.store.list_namespaces(prefix=["a", "b"]))["namespaces"] == [["a", "b"], ["a", "b", "d"]]
    assert (await sdk.store.list_namespaces(prefix=["z"]))["namespaces"] == [["z"]]
    assert (await sdk.store.list_namespaces(prefix=["q"]))["namespaces"] == []
    assert (await sdk.store.list_namespaces(suffix=["b"]))["namespaces"] == [["a", "b"]]
    assert (await sdk.store.list_namespaces(suffix=["d"]))["namespaces"] == [["a", "b", "d"]]
    assert (await sdk.store.list_namespaces(prefix=["a"], suffix=["c"]))["namespaces"] == [["a", "c"]]


async def test_list_namespaces_wildcard_label(sdk: LangGraphClient) -> None:
    await seed(sdk)
    assert (await sdk.store.list_namespaces(prefix=["a", "*"]))["namespaces"] == [
        ["a", "b"], ["a", "b", "d"], ["a", "c"]]
    assert (await sdk.store.list_namespaces(prefix=["*", "c"]))["namespaces"] == [["a", "c"]]


async def test_list_namespaces_max_depth_truncates_and_dedupes(sdk: LangGraphClient) -> None:
    await seed(sdk)
    assert (await sdk.store.list_namespaces(max_depth=1))["namespaces"] == [["a"], ["z"]]
    assert (await sdk.store.list_namespaces(max_depth=2))["namespaces"] == [["a", "b"], ["a", "c"], ["z"]]


async def test_list_namespaces_limit_offset(sdk: LangGraphClient) -> None:
    await seed(sdk)
    assert (await sdk.store.list_namespaces(limit=1, offset=1))["namespaces"] == [["a", "b", "d"]]
    assert (await sdk.store.list_namespaces(limit=2))["namespaces"] == [["a", "b"], ["a", "b", "d"]]
    assert (await sdk.store.list_namespaces(limit=10, offset=3))["namespaces"] == [["z"]]
    assert (await sdk.store.list_namespaces(offset=4))["namespaces"] == []


async def test_get_does_not_create_phantom_namespaces(sdk: LangGraphClient) -> None:
    """The reference lists a namespace after a mere GET on it; we do not."""
    await sdk.store.put_item(["real"], "k", {"v": 1})
    assert await sdk.store.get_item(["ghost", "ns"], "k") is None
    assert (await sdk.store.list_namespaces())["namespaces"] == [["real"]]


async def test_deleting_the_last_item_removes_the_namespace(sdk: LangGraphClient) -> None:
    await sdk.store.put_item(["gone"], "k", {"v": 1})
    await sdk.store.put_item(["stays"], "k", {"v": 1})
    await sdk.store.delete_item(["gone"], "k")
    assert (await sdk.store.list_namespaces())["namespaces"] == [["stays"]]


# --- bad input: always 422 JSON naming the field, never 500 --------------------------------------------------------


@pytest.mark.parametrize(("body", "field"), [
    ({"namespace": ["a"], "value": {"v": 1}}, "key"),
    ({"namespace": ["a"], "key": "k", "value": 5}, "value"),
    ({"namespace": ["a"], "key": "k", "value": "text"}, "value"),
    ({"namespace": ["a"], "key": "k", "value": [1, 2]}, "value"),
    ({"namespace": ["a"], "key": "k"}, "value"),
    ({"key": "k", "value": {"v": 1}}, "namespace"),
    ({"namespace": ["a.b"], "key": "k", "value": {"v": 1}}, "namespace"),
    ({"namespace": ["a", ""], "key": "k", "value": {"v": 1}}, "namespace"),
    ({"namespace": [], "key": "k", "value": {"v": 1}}, "namespace"),
    ({"namespace": "a", "key": "k", "value": {"v": 1}}, "namespace"),
    ({"namespace": ["a"], "key": "k", "value": {"v": 1}, "ttl": "soon"}, "ttl"),
    ({"namespace": ["a"], "key": "k", "value": {"v": 1}, "index": True}, "index"),
])
async def test_put_bad_input_is_422_naming_the_field(http: httpx.AsyncClient, sdk: LangGraphClient,
                                                     body: dict[str, Any], field: str) -> None:
    resp = await http.put("/store/items", json=body)
    assert_json_error(resp, 422, field)
    assert (await sdk.store.list_namespaces())["namespaces"] == []  # nothing was written


async def test_put_namespace_with_dot_reports_the_label(http: httpx.AsyncClient) -> None:
    resp = await http.put("/store/items", json={"namespace": ["ok", "a.b"], "key": "k", "value": {}})
    body = assert_json_error(resp, 422, "namespace")
    assert body["code"] == "invalid_input"
    assert "a.b" in body["detail"]


async def test_sdk_rejects_dotted_labels_client_side(sdk: LangGraphClient) -> None:
    with pytest.raises(ValueError, match="period"):
        await sdk.store.put_item(["a.b"], "k", {"v": 1})


async def test_put_without_a_json_body_is_422(http: httpx.AsyncClient) -> None:
    resp = await http.put("/store/items", content=b"not json", headers={"content-type": "application/json"})
    assert resp.status_code == 422
    assert {"detail", "code", "message"} <= set(resp.json())


@pytest.mark.parametrize(("params", "field"), [
    ({"namespace": "a"}, "key"),
    ({"key": "k"}, "namespace"),
    ({"namespace": "", "key": "k"}, "namespace"),
    ({"namespace": "a..b", "key": "k"}, "namespace"),
    ({"namespace": "a.", "key": "k"}, "namespace"),
])
async def test_get_bad_input_is_422_naming_the_field(http: httpx.AsyncClient, params: dict[str, str],
                                                     field: str) -> None:
    assert_json_error(await http.get("/store/items", params=params), 422, field)


@pytest.mark.parametrize(("body", "field"), [
    ({"namespace": ["a"]}, "key"),
    ({"key": "k"}, "namespace"),
    ({"namespace": ["a.b"], "key": "k"}, "namespace"),
])
async def test_delete_bad_input_is_422_naming_the_field(http: httpx.AsyncClient, body: dict[str, Any],
                                                        field: str) -> None:
    assert_json_error(await http.request("DELETE", "/store/items", json=body), 422, field)


async def test_delete_without_body_is_422(http: httpx.AsyncClient) -> None:
    resp = await http.request("DELETE", "/store/items", params={"namespace": "a", "key": "k"})
    assert resp.status_code == 422
    assert {"detail", "code", "message"} <= set(resp.json())


@pytest.mark.parametrize(("body", "field"), [
    ({"namespace_prefix": ["a"], "limit": 0}, "limit"),
    ({"namespace_prefix": ["a"], "limit": 1001}, "limit"),
    ({"namespace_prefix": ["a"], "limit": -1}, "limit"),
    ({"namespace_prefix": ["a"], "limit": "x"}, "limit"),
    ({"namespace_prefix": ["a"], "offset": -1}, "offset"),
    ({"namespace_prefix": ["a.b"]}, "namespace"),
    ({"namespace_prefix": ["a"], "filter": "red"}, "filter"),
])
async def test_search_bad_input_is_422_naming_the_field(http: httpx.AsyncClient, body: dict[str, Any],
                                                        field: str) -> None:
    assert_json_error(await http.post("/store/items/search", json=body), 422, field)


async def test_search_limit_bounds_are_inclusive(sdk: LangGraphClient) -> None:
    await seed(sdk)
    assert len((await sdk.store.search_items([], limit=1))["items"]) == 1
    assert len((await sdk.store.search_items([], limit=1000))["items"]) == 5


@pytest.mark.parametrize(("body", "field"), [
    ({"limit": 0}, "limit"),
    ({"limit": 1001}, "limit"),
    ({"offset": -1}, "offset"),
    ({"max_depth": 0}, "max_depth"),
    ({"prefix": ["a.b"]}, "namespace"),
    ({"suffix": [""]}, "namespace"),
])
async def test_list_namespaces_bad_input_is_422_naming_the_field(http: httpx.AsyncClient, body: dict[str, Any],
                                                                 field: str) -> None:
    assert_json_error(await http.post("/store/namespaces", json=body), 422, field)


# --- semantic search (store.index) ---------------------------------------------------------------------------------


async def test_resolve_store_index_loads_module_and_file_embeds() -> None:
    root = STORE_PROJECT.parent
    by_module = resolve_store_index({"dims": 26, "embed": "embeddings:embed"}, root)
    assert by_module is not None and callable(by_module["embed"])
    assert by_module["embed"](["ab"])[0][:3] == pytest.approx([2 ** -0.5, 2 ** -0.5, 0.0])
    by_file = resolve_store_index({"dims": 26, "embed": "./embeddings.py:embed", "fields": ["text"]}, root)
    assert by_file is not None and callable(by_file["embed"]) and by_file["fields"] == ["text"]
    # "provider:model" strings are LangGraph's business (langchain's init_embeddings): left untouched.
    provider = {"dims": 1536, "embed": "openai:text-embedding-3-small"}
    assert resolve_store_index(provider, root) == provider
    assert resolve_store_index(None, root) is None


def open_app(config: Path, backend: Backend) -> LifespanManager:
    settings = Settings(config=str(config), workers=0, **backend.settings())
    return LifespanManager(create_app(settings), startup_timeout=30, shutdown_timeout=30)


@pytest.fixture(params=BACKENDS)
def semantic_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A backend of the test's own (the shared app's holds no `store.index`), where it can search by meaning:
    on SQLite, only with loadable extensions."""
    if request.param == "sqlite" and not CAN_LOAD_EXTENSIONS:
        pytest.skip("this Python's sqlite3 cannot load extensions (sqlite-vec)")
    return fresh_backend(request, tmp_path)


@pytest_asyncio.fixture(loop_scope="module")
async def semantic_app(semantic_backend: Backend) -> AsyncIterator[object]:
    """The app over tests/project/store_index: `store.index` with a fake bag-of-letters embedding,
    named in langgraph.json as the string "embeddings:embed" (module form). On PostgreSQL without
    pgvector, the exact-scan store serves it."""
    async with open_app(STORE_PROJECT, semantic_backend) as manager:
        yield manager.app


@pytest_asyncio.fixture(loop_scope="module")
async def semantic_sdk(semantic_app: object) -> AsyncIterator[LangGraphClient]:
    transport = httpx.ASGITransport(app=semantic_app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://threadline", timeout=30) as client:
        yield LangGraphClient(client)


async def seed_texts(sdk: LangGraphClient) -> None:
    await sdk.store.put_item(["docs"], "fruit", {"text": "banana banana apple"})
    await sdk.store.put_item(["docs"], "zoo", {"text": "zebra xylophone quiz"})
    await sdk.store.put_item(["docs"], "code", {"text": "python programming"})


async def test_semantic_query_ranks_the_closest_item_first(semantic_sdk: LangGraphClient) -> None:
    await seed_texts(semantic_sdk)
    result = await semantic_sdk.store.search_items(["docs"], query="zebra quiz")
    ranked = keys(result)
    assert ranked[0] == "zoo"
    assert sorted(ranked) == ["code", "fruit", "zoo"]
    scores = [i["score"] for i in result["items"]]
    assert all(isinstance(s, float) for s in scores), scores
    assert scores == sorted(scores, reverse=True)
    assert scores[0] > scores[-1]

    again = await semantic_sdk.store.search_items(["docs"], query="a banana")
    assert keys(again)[0] == "fruit"


async def test_semantic_query_respects_limit_filter_and_prefix(semantic_sdk: LangGraphClient) -> None:
    await seed_texts(semantic_sdk)
    await semantic_sdk.store.put_item(["other"], "zoo2", {"text": "zebra quiz"})
    top = await semantic_sdk.store.search_items(["docs"], query="zebra quiz", limit=1)
    assert keys(top) == ["zoo"]
    filtered = await semantic_sdk.store.search_items(["docs"], query="zebra quiz",
                                                     filter={"text": "python programming"})
    assert keys(filtered) == ["code"]
    everywhere = await semantic_sdk.store.search_items([], query="zebra quiz")
    assert set(keys(everywhere)[:2]) == {"zoo", "zoo2"}


async def test_semantic_search_without_query_has_null_scores(semantic_sdk: LangGraphClient) -> None:
    await seed_texts(semantic_sdk)
    result = await semantic_sdk.store.search_items(["docs"])
    assert sorted(keys(result)) == ["code", "fruit", "zoo"]
    assert all(i["score"] is None for i in result["items"])


async def test_semantic_reindexes_on_overwrite(semantic_sdk: LangGraphClient) -> None:
    await seed_texts(semantic_sdk)
    before = await semantic_sdk.store.search_items(["docs"], query="python programming")
    assert keys(before)[0] == "code"
    await semantic_sdk.store.put_item(["docs"], "code", {"text": "fuzzy jazz quiz"})
    after = await semantic_sdk.store.search_items(["docs"], query="python programming")
    assert keys(after)[0] == "zoo"
    assert {i["key"]: i["score"] for i in after["items"]}["code"] < before["items"][0]["score"]


async def test_embed_given_as_a_file_path_is_resolved(semantic_backend: Backend) -> None:
    """`"embed": "./embeddings.py:embed"`, relative to langgraph.json, as LangGraph's server accepts."""
    async with open_app(FILE_EMBED_PROJECT, semantic_backend) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://threadline") as client:
            sdk = LangGraphClient(client)
            await seed_texts(sdk)
            result = await sdk.store.search_items(["docs"], query="zebra quiz")
            assert keys(result)[0] == "zoo"
            assert result["items"][0]["score"] is not None


async def test_semantic_search_leaves_out_items_put_with_index_false(semantic_sdk: LangGraphClient) -> None:
    await seed_texts(semantic_sdk)
    await semantic_sdk.store.put_item(["docs"], "hidden", {"text": "zebra quiz"}, index=False)
    found = await semantic_sdk.store.search_items(["docs"], query="zebra quiz")
    assert sorted(keys(found)) == ["code", "fruit", "zoo"]
    assert "hidden" in keys(await semantic_sdk.store.search_items(["docs"]))


async def test_semantic_put_names_its_fields_and_an_item_scores_by_its_closest(semantic_sdk: LangGraphClient) -> None:
    await seed_texts(semantic_sdk)
    await semantic_sdk.store.put_item(["docs"], "both", {"text": "banana apple", "title": "zebra quiz"},
                                      index=["text", "title"])
    await semantic_sdk.store.put_item(["docs"], "titled", {"text": "python programming", "title": "jazz"},
                                      index=["title"])
    for query in ("zebra quiz", "banana apple"):  # either field of "both" matches exactly
        result = await semantic_sdk.store.search_items(["docs"], query=query)
        assert keys(result)[0] == "both", query
        assert result["items"][0]["score"] == pytest.approx(1.0, abs=1e-4)
    # "titled" was indexed by its title only: its text does not make it a match for "python programming".
    result = await semantic_sdk.store.search_items(["docs"], query="python programming")
    scores = {i["key"]: i["score"] for i in result["items"]}
    assert keys(result)[0] == "code" and scores["titled"] < 0.5


async def test_semantic_search_pages_with_limit_and_offset(semantic_sdk: LangGraphClient) -> None:
    await seed_texts(semantic_sdk)
    ranked = keys(await semantic_sdk.store.search_items(["docs"], query="zebra quiz"))
    pages = [keys(await semantic_sdk.store.search_items(["docs"], query="zebra quiz", limit=1, offset=n))
             for n in range(4)]
    assert pages == [[key] for key in ranked] + [[]]


async def test_semantic_search_forgets_deleted_items(semantic_sdk: LangGraphClient) -> None:
    await seed_texts(semantic_sdk)
    await semantic_sdk.store.delete_item(["docs"], "zoo")
    assert sorted(keys(await semantic_sdk.store.search_items(["docs"], query="zebra quiz"))) == ["code", "fruit"]


async def test_info_says_how_postgres_searches_by_meaning(scaleout_services: ScaleOut) -> None:
    """With store.index, PostgreSQL searches by meaning through pgvector, or by exact scan where the
    server lacks it; /info says which (and null without store.index)."""
    backend = scaleout_services.fresh()
    async with await psycopg.AsyncConnection.connect(backend.database_url) as conn:
        cur = await conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        pgvector = await cur.fetchone() is not None
    for project, expected in ((STORE_PROJECT, "pgvector" if pgvector else "exact_scan"), (PLAIN_PROJECT, None)):
        async with open_app(project, backend) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://threadline") as client:
                storage = (await client.get("/info")).json()["storage"]
        assert storage["backend"] == "postgresql", storage
        assert storage["vector_search"] is True, storage
        assert storage["vector_index"] == expected, (project, storage)


# --- PostgreSQL's exact scan, on its own (whether or not this server has pgvector) ----------------------------------


@pytest_asyncio.fixture(loop_scope="module")
async def exact_scan(scaleout_services: ScaleOut) -> AsyncIterator[ExactScanStore]:
    """The exact-scan store over a clean PostgreSQL database, with the fake embedding and a TTL config."""
    url = scaleout_services.fresh().database_url
    await (await open_storage(url)).close()  # our migrations (threadline_store_vectors), LangGraph's store tables
    pool = AsyncConnectionPool(url, min_size=1, max_size=4, open=False,
                               kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row})
    await pool.open()
    index = resolve_store_index({"dims": 26, "embed": "embeddings:embed", "fields": ["text"]}, STORE_PROJECT.parent)
    try:
        yield ExactScanStore(pool, index=index or {}, ttl={"refresh_on_read": True})
    finally:
        await pool.close()


async def scored(store: ExactScanStore, query: str, **kwargs: Any) -> dict[str, float | None]:
    return {i.key: i.score for i in await store.asearch(("docs",), query=query, **kwargs)}


async def test_exact_scan_reindexes_overwrites_and_forgets_deletes(exact_scan: ExactScanStore) -> None:
    await exact_scan.aput(("docs",), "a", {"text": "zebra quiz"})
    assert (await scored(exact_scan, "zebra quiz"))["a"] == pytest.approx(1.0)
    await exact_scan.aput(("docs",), "a", {"text": "python programming"})
    assert (await scored(exact_scan, "python programming"))["a"] == pytest.approx(1.0)
    assert (await scored(exact_scan, "zebra quiz"))["a"] < 0.5  # the old text's vector is gone
    # Overwritten with index=False, the item is no longer indexed (its old vectors do not linger).
    await exact_scan.aput(("docs",), "a", {"text": "zebra quiz"}, index=False)
    assert await scored(exact_scan, "zebra quiz") == {}
    assert [i.key for i in await exact_scan.asearch(("docs",))] == ["a"]
    await exact_scan.aput(("docs",), "a", {"text": "zebra quiz"})
    await exact_scan.adelete(("docs",), "a")
    await exact_scan.aput(("docs",), "b", {"text": "zebra"}, index=False)
    assert await scored(exact_scan, "zebra quiz") == {}


async def test_exact_scan_serves_sync_calls_filters_and_list_fields(exact_scan: ExactScanStore) -> None:
    await exact_scan.aput(("docs",), "zoo", {"text": "zebra xylophone quiz", "n": 1})
    await exact_scan.aput(("docs", "deep"), "code", {"text": "python programming", "n": 2})
    await exact_scan.aput(("docs",), "tags", {"text": "-", "tags": ["banana", "jazz quiz"], "n": 3}, index=["tags[*]"])
    await exact_scan.aput(("elsewhere",), "code2", {"text": "python programming", "n": 2})
    # The sync API (a graph node's `get_store().search`) goes through the same abatch.
    hits = await asyncio.to_thread(exact_scan.search, ("docs",), query="python programming")
    assert hits[0].key == "code" and {h.key for h in hits} == {"code", "zoo", "tags"}
    assert hits[0].namespace == ("docs", "deep") and hits[0].score == pytest.approx(1.0)
    assert hits[0].value == {"text": "python programming", "n": 2}
    # LangGraph's own filter operators apply, before ranking.
    assert set(await scored(exact_scan, "python programming", filter={"n": {"$gte": 2}})) == {"code", "tags"}
    # Each element of a list field has its own vector; the item scores by the closest.
    assert (await scored(exact_scan, "banana"))["tags"] == pytest.approx(1.0)
    assert (await scored(exact_scan, "jazz quiz"))["tags"] == pytest.approx(1.0)


async def test_exact_scan_keeps_ttls_refreshing_what_a_search_returns(exact_scan: ExactScanStore,
                                                                      scaleout_services: ScaleOut) -> None:
    await exact_scan.aput(("docs",), "kept", {"text": "zebra quiz"}, ttl=1)
    await exact_scan.aput(("docs",), "other", {"text": "python programming"}, ttl=1)
    # A minute is long for a test: bring both items to within a second of expiring.
    async with await psycopg.AsyncConnection.connect(scaleout_services.url, autocommit=True) as conn:
        await conn.execute("UPDATE store SET expires_at = now() + interval '1 second'")
    # The search returns (and so refreshes, refresh_on_read) only "kept"; the candidates it ranked are not.
    assert list(await scored(exact_scan, "zebra quiz", limit=1)) == ["kept"]
    # 1.5 s pass, for the rows: "other" is past its expiry, "kept" (refreshed to a minute) is not.
    async with await psycopg.AsyncConnection.connect(scaleout_services.url, autocommit=True) as conn:
        await conn.execute("UPDATE store SET expires_at = expires_at - interval '1.5 seconds'")
    assert await exact_scan.sweep_ttl() == 1  # "other"
    assert list(await scored(exact_scan, "python programming")) == ["kept"]
    assert await exact_scan.aget(("docs",), "other") is None
