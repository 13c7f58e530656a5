"""The comparator itself: masking hides ids and times but never a changed value, and every kind of
difference (status, header, body field, missing key, extra event, extra request) is reported."""

from __future__ import annotations

import json

import httpx

from tests.differential.accepted import Accepted, classify
from tests.differential.compare import Difference, Exchange, compare, mask, parse_sse

TID = "1f0c2b7e-0000-4000-8000-000000000001"
OTHER = "9a9a9a9a-1111-4111-8111-111111111111"


def exchange(status: int = 200, body: object = None, *, step: str = "s", headers: dict[str, str] | None = None,
             sse: str | None = None, path: str = f"/threads/{TID}") -> Exchange:
    request = httpx.Request("GET", f"http://x{path}")
    if sse is not None:
        response = httpx.Response(status, headers={"content-type": "text/event-stream", **(headers or {})})
        return Exchange.of(step, request, response, sse.encode())
    response = httpx.Response(status, headers={"content-type": "application/json", **(headers or {})})
    return Exchange.of(step, request, response, httpx.Response(200, json=body).content if body is not None else b"")


def fields(diffs: list[Difference]) -> set[str]:
    return {d.field for d in diffs}


def test_ids_and_times_are_masked_but_values_are_not() -> None:
    a = {"thread_id": TID, "created_at": "2026-12-01T08:00:00.123+00:00", "n": 1, "msg": f"run {TID} done"}
    b = {"thread_id": OTHER, "created_at": "2027-01-02T09:10:11Z", "n": 1, "msg": f"run {OTHER} done"}
    assert mask(a) == mask(b)
    assert compare("t", [exchange(body=a)], [exchange(body=b)]) == []
    assert fields(compare("t", [exchange(body=a)], [exchange(body={**b, "n": 2})])) == {"body.n"}


def test_status_header_and_missing_keys_are_reported() -> None:
    ref = exchange(200, {"a": 1, "nested": {"x": [1, 2]}}, headers={"location": f"/threads/{TID}"})
    tl = exchange(404, {"nested": {"x": [1, 3], "extra": True}})
    diffs = compare("t", [ref], [tl])
    assert fields(diffs) == {"status", "header.location", "body.a", "body.nested.x[]", "body.nested.extra"}
    changed = next(d for d in diffs if d.field == "body.nested.x[]")
    assert (changed.reference, changed.threadline, changed.index) == (2, 3, "body.nested.x[1]")


def test_event_streams_are_aligned_and_an_extra_event_is_one_difference() -> None:
    ref = "event: metadata\ndata: {\"run_id\": \"" + TID + "\"}\n\nevent: values\ndata: {\"n\": 1}\n\n"
    tl = ref.replace("event: values", "event: custom\ndata: {\"p\": 0}\n\nevent: values")
    diffs = compare("t", [exchange(sse=ref)], [exchange(sse=tl.replace('"n": 1', '"n": 1'))])
    assert [(d.field, d.reference, d.threadline) for d in diffs] == [("sse[custom]", "<absent>", {"p": 0})]
    changed = compare("t", [exchange(sse=ref)], [exchange(sse=ref.replace('"n": 1', '"n": 2'))])
    assert fields(changed) == {"sse[values].data.n"}
    assert parse_sse(": ping\r\n\r\nevent: end\r\ndata: \r\n\r\n") == [{"event": "end", "data": None}]


def _sse(*events: tuple[str, object]) -> str:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)


def _task_end(n: int, step: int = 1) -> list[tuple[str, object]]:
    return [("updates", {"square": n}), ("debug", {"type": "task_result", "step": step,
                                                   "payload": {"name": "square", "result": {"__return__": n}}})]


def test_concurrent_task_ends_of_one_step_compare_in_any_order_but_nothing_else_does() -> None:
    """The ends of one step's concurrent tasks arrive in the order they finished (neither server defines it, a
    CI run saw them differ): compared as a set. Their values, the other events' order and two steps' order
    still count."""
    start, end = [("metadata", {"run_id": TID}), ("values", {"n": 0})], [("values", {"n": 3})]
    ref = _sse(*start, *_task_end(1), *_task_end(4), *_task_end(9), *end)
    raced = _sse(*start, *_task_end(4), *_task_end(9), *_task_end(1), *end)
    assert compare("t", [exchange(sse=ref)], [exchange(sse=raced)]) == []
    wrong = _sse(*start, *_task_end(4), *_task_end(9), *_task_end(2), *end)
    assert fields(compare("t", [exchange(sse=ref)], [exchange(sse=wrong)])) == {
        "sse[updates].data.square", "sse[debug].data.payload.result.__return__"}
    two_steps = _sse(*start, *_task_end(1, step=1), *_task_end(4, step=2), *end)
    swapped = _sse(*start, *_task_end(4, step=2), *_task_end(1, step=1), *end)
    assert compare("t", [exchange(sse=two_steps)], [exchange(sse=swapped)]) != []
    sequential = _sse(*start, ("updates", {"a": 1}), ("updates", {"b": 2}), *end)
    reordered = _sse(*start, ("updates", {"b": 2}), ("updates", {"a": 1}), *end)
    assert compare("t", [exchange(sse=sequential)], [exchange(sse=reordered)]) != []


def test_a_request_only_one_server_saw_is_a_difference() -> None:
    first, extra = exchange(body={"a": 1}, step="a"), exchange(body={"b": 1}, step="b")
    diffs = compare("t", [first], [first, extra])
    assert [(d.step, d.field, d.reference) for d in diffs] == [("b", "exchange", "<absent>")]


def test_an_accepted_entry_accepts_only_its_field_where_it_happens(monkeypatch: object) -> None:
    entry = Accepted("k", "open", r"GET /threads/<uuid>$", r"body\.status", "because")
    import tests.differential.accepted as accepted

    monkeypatch.setattr(accepted, "ACCEPTED", [entry])  # type: ignore[attr-defined]
    diff = compare("t", [exchange(body={"status": "idle", "n": 1})], [exchange(body={"status": "busy", "n": 2})])
    assert [classify(d) for d in diff] == [None, entry]  # body.n is not excused by the body.status entry
    elsewhere = compare("t", [exchange(body={"status": "a"}, path="/runs")],
                        [exchange(body={"status": "b"}, path="/runs")])
    assert classify(elsewhere[0]) is None
