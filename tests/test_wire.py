"""Wire details clients read, each checked against LangGraph's server (langgraph-api 0.16.7, `langgraph dev`)."""

from __future__ import annotations

import httpx

QUICK = {"assistant_id": "slow", "input": {"tag": "w", "steps": 1, "delay": 0}}


async def test_run_creating_endpoints_say_where_the_run_is(http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]

    r = await http.post(f"/threads/{tid}/runs", json=QUICK)
    rid = r.json()["run_id"]
    assert r.headers["content-location"] == f"/threads/{tid}/runs/{rid}" and "location" not in r.headers
    r = await http.get(f"/threads/{tid}/runs/{rid}/join")
    assert (r.headers["content-location"], r.headers["location"]) == (
        f"/threads/{tid}/runs/{rid}", f"/threads/{tid}/runs/{rid}/join")

    r = await http.post(f"/threads/{tid}/runs/wait", json=QUICK)
    rid = r.headers["content-location"].rsplit("/", 1)[1]
    assert r.headers["content-location"] == f"/threads/{tid}/runs/{rid}"
    assert r.headers["location"] == f"/threads/{tid}/runs/{rid}/join"

    async with http.stream("POST", f"/threads/{tid}/runs/stream", json=QUICK) as r:
        rid = r.headers["content-location"].rsplit("/", 1)[1]
        assert r.headers["content-location"] == f"/threads/{tid}/runs/{rid}"
        assert r.headers["location"] == f"/threads/{tid}/runs/{rid}/stream"

    # Stateless: a background run and a stream are named by the run alone, a wait by its (temporary) thread.
    r = await http.post("/runs", json=QUICK)
    assert r.headers["content-location"] == f"/runs/{r.json()['run_id']}"
    async with http.stream("POST", "/runs/stream", json=QUICK) as r:
        rid = r.headers["content-location"].rsplit("/", 1)[1]
        assert r.headers["content-location"] == f"/runs/{rid}"
        assert r.headers["location"] == f"/runs/{rid}/stream"
    r = await http.post("/runs/wait", json=QUICK)
    head, _, rid = r.headers["content-location"].rpartition("/runs/")
    assert head.startswith("/threads/") and head != f"/threads/{tid}"
    assert r.headers["location"] == f"{head}/runs/{rid}/join"


async def test_root_answers_ok(http: httpx.AsyncClient) -> None:
    r = await http.get("/")
    assert (r.status_code, r.json()) == (200, {"ok": True})


async def test_store_refuses_bad_namespaces_and_keys_with_422(http: httpx.AsyncClient) -> None:
    """Labels LangGraph's store refuses, and NUL bytes PostgreSQL cannot keep, are the client's mistake."""
    for query in ("namespace=a.&key=k", "namespace=&key=k", "namespace=a%00b&key=k", "namespace=a&key=k%00"):
        r = await http.get(f"/store/items?{query}")
        assert r.status_code == 422 and r.json()["detail"], (query, r.text)
    for body in ({"namespace": ["a", ""], "key": "k", "value": {}}, {"namespace": ["a\x00"], "key": "k", "value": {}},
                 {"namespace": ["a"], "key": "k\x00", "value": {}}, {"namespace": ["langgraph"], "key": "k", "value": {}}):
        r = await http.put("/store/items", json=body)
        assert r.status_code == 422 and r.json()["detail"], (body, r.text)
    r = await http.request("DELETE", "/store/items", json={"namespace": ["a"], "key": "k\x00"})
    assert r.status_code == 422
    assert (await http.put("/store/items", json={"namespace": ["a"], "key": "k", "value": {"v": 1}})).status_code == 204
    assert (await http.get("/store/items?namespace=a&key=k")).json()["value"] == {"v": 1}
