"""The long-term store: namespaced items, search (semantic when `store.index` is configured), namespaces."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from starlette.responses import Response

from threadline.api.common import JSON, Router, no_content, runtime
from threadline.api.models import StoreDelete, StoreNamespaces, StorePut, StoreSearch
from threadline.errors import InvalidInput

router = Router(prefix="/store", tags=["Store"])


def _namespace(labels: list[str] | None, *, allow_empty: bool = False) -> tuple[str, ...]:
    labels = labels or []
    if not labels and not allow_empty:
        raise InvalidInput("namespace: must not be empty")
    for label in labels:
        if not label:
            raise InvalidInput("namespace: labels must be non-empty strings")
        if "." in label:
            raise InvalidInput(f"namespace: label {label!r} must not contain '.'")
        if "\x00" in label:
            raise InvalidInput(f"namespace: label {label!r} must not contain NUL bytes")
    return tuple(labels)


def _key(key: str) -> str:
    # PostgreSQL's text refuses NUL (a 500 from the driver otherwise); refused on every backend alike.
    if "\x00" in key:
        raise InvalidInput("key: must not contain NUL bytes")
    return key


def _timestamp(value: datetime) -> str:
    # LangGraph's SQLite store keeps SQLite's CURRENT_TIMESTAMP: UTC, but read back without a timezone.
    # Say so, like every other timestamp we serve (`...+00:00`), or clients would read it as local time.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.isoformat()


def item_out(item: Any) -> dict[str, Any]:
    out = {
        "namespace": list(item.namespace), "key": item.key, "value": item.value,
        "created_at": _timestamp(item.created_at), "updated_at": _timestamp(item.updated_at),
    }
    if hasattr(item, "score"):
        out["score"] = item.score
    return out


async def _authorized(request: Request, action: str, value: dict[str, Any]) -> tuple[str, ...]:
    """The namespace the caller may use (`@auth.on.store` may rewrite it, or refuse), checked as given."""
    namespace = await runtime(request).access.store(action, value)
    return _namespace(list(namespace), allow_empty=action in ("search", "list_namespaces"))


@router.put("/items", status_code=204)
async def put_item(request: Request, body: StorePut) -> Response:
    store = runtime(request).storage.store
    index: Any = body.index if body.index is not None else None
    kwargs: dict[str, Any] = {}
    if body.ttl is not None:
        kwargs["ttl"] = body.ttl
    namespace = await _authorized(request, "put", {"namespace": _namespace(body.namespace), "key": _key(body.key),
                                                   "value": body.value, "index": index, "ttl": body.ttl})
    await store.aput(namespace, _key(body.key), body.value, index=index, **kwargs)
    return no_content()


@router.get("/items")
async def get_item(request: Request, key: str, namespace: str = "", refresh_ttl: bool | None = None) -> JSON:
    labels = namespace.split(".") if namespace else []
    ns = await _authorized(request, "get", {"namespace": _namespace(labels), "key": _key(key)})
    kwargs = {"refresh_ttl": refresh_ttl} if refresh_ttl is not None else {}
    item = await runtime(request).storage.store.aget(ns, _key(key), **kwargs)
    # Decision: a missing item is `200` with body `null`, as on LangGraph's server, not a 404.
    # langgraph-sdk's `store.get_item` raises `NotFoundError` on any 404 but returns `None` for a `null`
    # body, and callers rely on `if await client.store.get_item(...) is None`; a 404 would break them.
    return JSON(item_out(item) if item is not None else None)


@router.delete("/items", status_code=204)
async def delete_item(request: Request, body: StoreDelete) -> Response:
    namespace = await _authorized(request, "delete", {"namespace": _namespace(body.namespace), "key": _key(body.key)})
    await runtime(request).storage.store.adelete(namespace, _key(body.key))
    return no_content()


@router.post("/items/search")
async def search_items(request: Request, body: StoreSearch) -> JSON:
    kwargs = {"refresh_ttl": body.refresh_ttl} if body.refresh_ttl is not None else {}
    prefix = await _authorized(request, "search", {
        "namespace": _namespace(body.namespace_prefix, allow_empty=True), "filter": body.filter, "limit": body.limit,
        "offset": body.offset, "query": body.query})
    items = await runtime(request).storage.store.asearch(
        prefix, query=body.query, filter=body.filter,
        limit=body.limit, offset=body.offset, **kwargs,
    )
    return JSON({"items": [item_out(i) for i in items]})


@router.post("/namespaces")
async def list_namespaces(request: Request, body: StoreNamespaces) -> JSON:
    prefix = await _authorized(request, "list_namespaces", {
        "namespace": _namespace(body.prefix, allow_empty=True), "suffix": body.suffix, "max_depth": body.max_depth,
        "limit": body.limit, "offset": body.offset})
    namespaces = await runtime(request).storage.store.alist_namespaces(
        prefix=prefix or None,
        suffix=_namespace(body.suffix, allow_empty=True) or None,
        max_depth=body.max_depth, limit=body.limit, offset=body.offset,
    )
    return JSON({"namespaces": [list(ns) for ns in namespaces]})
