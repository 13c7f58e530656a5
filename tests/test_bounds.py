"""Input that storage, the serializer or the clock cannot hold is refused at the edge (`threadline.api.bounds`,
the request models): a 422 naming where it is, and nothing stored. Each case below was a 500 (an overflow,
an encoding error, a recursion error) before."""

from __future__ import annotations

import json
from typing import Any

import httpx

from threadline.api.bounds import MAX_DEPTH, problem

BIG = 2**63  # one past what SQLite, PostgreSQL's bigint and orjson hold


def nested(depth: int) -> str:
    return '{"a":' * depth + "{}" + "}" * depth


def raw(body: dict[str, Any], **raw_values: str) -> bytes:
    """`body` as JSON, with each `raw_values` key's value spliced in as JSON text (what `json.dumps` refuses
    to write: too deep, or a lone surrogate escape)."""
    text = json.dumps({**body, **{k: f"@@{k}@@" for k in raw_values}})
    for key, value in raw_values.items():
        text = text.replace(f'"@@{key}@@"', value)
    return text.encode()


def test_problem_names_the_path_of_what_cannot_be_stored() -> None:
    assert problem({"a": [1, {"b": "ok", "c": 2.5, "d": None, "e": True}]}) is None
    assert problem({"a": [1, {"b": 2**63}]}) == (("a", 1, "b"),
                                                 "Integers must fit in 64 bits (from -2**63 to 2**63 - 1)")
    assert problem({"a": -(2**63)}) is None and problem({"a": -(2**63) - 1}) is not None
    assert problem({"x": "\ud800"})[0] == ("x",)
    assert problem({"\udfff": 1})[0] == ("\udfff",)
    assert problem({"f": float("nan")})[0] == ("f",)
    assert problem(json.loads(nested(MAX_DEPTH - 1))) is None
    assert problem(json.loads(nested(MAX_DEPTH)))[1].startswith("Objects and arrays may nest")


async def test_unstorable_input_is_a_422_naming_the_field_and_nothing_is_stored(http: httpx.AsyncClient) -> None:
    assistant = (await http.post("/assistants/search", json={})).json()[0]["assistant_id"]
    thread = (await http.post("/threads", json={})).json()["thread_id"]
    cases: list[tuple[str, str, bytes | None, str]] = [
        *[("POST", path, raw({"offset": BIG}), "offset") for path in (
            "/threads/search", "/runs/search", "/assistants/search", "/runs/crons/search", "/store/items/search")],
        ("GET", f"/threads/{thread}/runs?offset=99999999999999999999", None, "query.offset"),
        ("POST", "/runs/crons/count", raw({"metadata": {"k": [360545032389145013518336]}}), "metadata.k.0"),
        ("POST", "/threads", raw({"metadata": {"k": -BIG - 1}}), "metadata.k"),
        ("POST", "/store/items/search", raw({"filter": {"a b": 1}}), "filter.a b"),
        ("POST", "/threads", raw({}, metadata='{"x": "\\ud800"}'), "metadata.x"),
        ("POST", "/threads", raw({}, metadata='{"\\udc00": 1}'), "metadata.\\udc00"),
        ("POST", "/threads", raw({}, metadata='{"x": NaN}'), "metadata.x"),
        ("POST", "/assistants", raw({"graph_id": "agent"}, metadata='{"x": Infinity}'), "metadata.x"),
        ("POST", f"/threads/{thread}/runs", raw({"assistant_id": assistant, "after_seconds": 1e308}),
         "after_seconds"),
        ("POST", "/threads", raw({"ttl": 1e308}), "ttl.minutes"),
        ("POST", "/threads", raw({"ttl": {"ttl": 1e308}}), "ttl.object.ttl"),
        ("PUT", "/store/items", raw({"namespace": ["a"], "key": "k", "value": {}, "ttl": 1e308}), "ttl"),
        # Found by tests/test_fuzz.py: filter keys SQLite cannot name in a JSON path (on PostgreSQL they
        # worked: refused on both, so both answer the same), at any depth.
        ("POST", "/agents/search", raw({"metadata": {'a"b': ["help"]}}), 'metadata.a"b'),
        ("POST", "/threads/count", raw({"values": {"a\u0000b": 1}}), "values.a\x00b"),
        ("POST", "/threads/search", raw({"metadata": {"k": {"a\\b": 1}}}), "metadata.k.a\\b"),
        ("POST", "/runs/crons/count", raw({"metadata": {"a\nb": 1}}), "metadata.a\nb"),
        # the checkpointer's rule
        ("POST", f"/threads/{thread}/history", raw({"metadata": {"a b": 1}}), "metadata.a b"),
        # Found by tests/test_fuzz.py on PostgreSQL: NUL, which its text and jsonb refuse (in a value, a key, a
        # list of node names); a max_depth past its integer; a thread id to prune that is no UUID.
        ("POST", "/threads", raw({"metadata": {"x": "a\u0000b"}}), "metadata.x"),
        ("POST", "/threads", raw({"metadata": {"a\u0000": 1}}), "metadata.a\x00"),
        ("POST", "/runs", raw({"assistant_id": assistant, "interrupt_before": ["\u0000"]}), "interrupt_before.0"),
        ("POST", "/store/namespaces", raw({"max_depth": 2**32}), "max_depth"),
        ("POST", "/threads/prune", raw({"thread_ids": ["not-a-uuid"]}), "thread_ids.0"),
        # Found by tests/test_fuzz.py: a negative TTL past what the clock can subtract.
        ("PUT", "/store/items", raw({"namespace": ["a"], "key": "k", "value": {}, "ttl": -1e300}), "ttl"),
        ("POST", "/runs/wait", raw({"assistant_id": assistant, "config": {"configurable": []}}),
         "config.configurable"),
        ("POST", "/runs", raw({"assistant_id": assistant}, input=nested(MAX_DEPTH + 5)), "input.a.a"),
        ("POST", "/runs", raw({"assistant_id": assistant}, input=nested(1000)), "body"),
        ("POST", f"/threads/{thread}/commands",
         raw({"id": 1, "method": "run.input"}, params=f'{{"input": {nested(MAX_DEPTH + 5)}}}'), "params.input.a"),
        ("POST", f"/threads/{thread}/commands", raw({"id": 1, "method": "run.input"}, params=nested(1000)), "body"),
    ]
    for method, path, body, field in cases:
        response = await http.request(method, path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, (path, body and body[:80], response.text)
        assert response.json()["detail"].startswith(f"{field}"), (path, response.json()["detail"])
    # Nothing was stored: only the one thread this test made, no runs, no store items, no crons.
    assert (await http.post("/threads/count", json={})).json() == 1
    assert (await http.post("/runs/search", json={})).json() == []
    assert (await http.post("/store/items/search", json={})).json()["items"] == []
    assert (await http.post("/runs/crons/count", json={})).json() == 0


async def test_json_rpc_params_are_bounded_too(http: httpx.AsyncClient) -> None:
    assistant = (await http.post("/assistants/search", json={})).json()[0]["assistant_id"]
    body = raw({"jsonrpc": "2.0", "id": 1, "method": "message/send"}, params=f'{{"x": {nested(MAX_DEPTH + 5)}}}')
    response = await http.post(f"/a2a/{assistant}", content=body, headers={"content-type": "application/json"})
    error = response.json()["error"]
    assert error["code"] == -32602 and error["message"].startswith("Invalid params: params.x.a.a"), error


async def test_a_large_float_comes_back_as_itself(http: httpx.AsyncClient) -> None:
    """PostgreSQL's jsonb writes 1e30 in full, as an integer past 64 bits: read back as such it broke the
    answer, and every later search holding that row (a 500 each; found by tests/test_fuzz.py)."""
    created = await http.post("/threads", json={"metadata": {"x": 1e30, "n": 2**63 - 1}})
    assert created.status_code == 200, created.text
    found = (await http.post("/threads/search", json={})).json()
    assert [t["metadata"] for t in found] == [{"x": 1e30, "n": 2**63 - 1}]
