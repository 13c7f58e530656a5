"""The app's routes tried once per request: only those that can take the path's first segment, each matched once.

FastAPI (0.165) routes a request by trying every entry of the app's router in turn, and since routers are
included as whole branches (`_IncludedRouter`), a branch that takes the request is matched twice: once to
find it, once more to pick the route inside it. Each branch tried costs its scope bookkeeping even when
`common.Router` declines it at once, so `GET /ok`, behind seven routers, spent a third of its CPU routing
(measured in process through ASGI, `bench/README.md` "The short runs against the floor (2026-12-07)").

`RouteIndex` stands where the app's router is called and hands the request to a view of that router holding
only the entries whose paths can begin with the request's first segment (and those that begin with a
parameter), in their order. A view is the router itself, shallow-copied with fewer routes, so everything a
router does when nothing takes the request (405, the trailing-slash redirect, the 404) is FastAPI's own: a
path with another first segment could not have matched the entries left out, and a redirect only adds or
drops a trailing slash. An app with low-priority routes (FastAPI's frontend routes, which may match any path)
is not indexed. `remember_matches` makes a branch's second match the first one's answer.
"""

from __future__ import annotations

import copy
from typing import Any

from starlette.routing import Match

_MATCHED = "threadline.matched"  # scope key: (branch, its `_match` answer) between a branch's two matches


def head(path: str) -> str | None:
    """A route path's first segment (`/threads/{id}` -> "threads"); None when a route with this path might
    take a request whose first segment is anything (a parameter, a root mount)."""
    if not path.startswith("/"):
        return None
    first = path[1:].split("/", 1)[0]
    return None if "{" in first else first


def route_heads(route: Any) -> frozenset[str] | None:
    """The first segments of the paths `route` can take; None: any."""
    original = getattr(route, "original_router", None)  # FastAPI's included branch
    if original is not None:
        prefix = getattr(getattr(route, "include_context", None), "prefix", "")
        if prefix:
            first = head(prefix)
            return None if first is None else frozenset({first})
        heads: set[str] = set()
        for inner in original.routes:
            found = route_heads(inner)
            if found is None:
                return None
            heads |= found
        return frozenset(heads)
    path = getattr(route, "path", None)
    if not isinstance(path, str) or not path:
        return None
    first = head(path)
    return None if first is None else frozenset({first})


class RouteIndex:
    """ASGI, in place of the app router's own call: the request goes to the view of the router for its first
    segment. Lifespan and anything else go to the router itself."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self._views: dict[str, Any] = {}
        self._rest: Any = router
        self._version: tuple[int, int, int] | None = None
        self._branches: list[list[Any]] = []  # the route lists of the included routers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.router.app(scope, receive, send)
            return
        version = self._routes_version()
        if version != self._version:
            self._build()
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        first = head(path)
        view = self._views.get(first, self._rest) if first is not None else self.router
        scope.setdefault("router", self.router)  # url_for and friends see the whole router, not the view
        await view.app(scope, receive, send)

    def _routes_version(self) -> tuple[int, int, int]:
        """Changes when a route is added to the app or to a router it includes (then the views are rebuilt)."""
        routes = self.router.routes
        return id(routes), len(routes), sum(map(len, self._branches))

    def _build(self) -> None:
        routes = list(self.router.routes)
        self._branches = [r.original_router.routes for r in routes if getattr(r, "original_router", None) is not None]
        heads = [(route, route_heads(route)) for route in routes]
        if _has_low_priority(self.router):
            self._views, self._rest = {}, self.router
        else:
            known = set().union(*(h for _, h in heads if h is not None))
            self._views = {first: self._view([r for r, h in heads if h is None or first in h]) for first in known}
            self._rest = self._view([r for r, h in heads if h is None])
        self._version = self._routes_version()

    def _view(self, routes: list[Any]) -> Any:
        view = copy.copy(self.router)
        view.routes = routes
        return view


def _has_low_priority(router: Any) -> bool:
    low = getattr(router, "_iter_low_priority_routes", None)
    return low is not None and next(iter(low()), None) is not None


def remember_matches(router: Any) -> None:
    """Each of `router`'s included branches answers its second match of a request (`_handle_selected`, after
    `matches` found it) with its first answer, kept in the scope, instead of trying its routes again. Nothing
    is done on a FastAPI without such branches."""
    for route in router.routes:
        match = getattr(route, "_match", None)
        if getattr(route, "original_router", None) is None or match is None or hasattr(match, "remembering"):
            continue
        route._match = _remembering(route, match)


def _remembering(branch: Any, match: Any) -> Any:
    def remembered(scope: Any) -> Any:
        kept = scope.pop(_MATCHED, None)
        if kept is not None and kept[0] is branch:
            return kept[1]
        found = match(scope)
        if found[0] == Match.FULL:
            scope[_MATCHED] = (branch, found)
        return found

    remembered.remembering = True  # type: ignore[attr-defined]
    return remembered
