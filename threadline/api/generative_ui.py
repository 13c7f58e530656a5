"""Generative UI at LangGraph's paths: what the SDK's `LoadExternalComponent` asks for.

- `POST /ui/{graph_id}` with `{"name": <component>}` answers `text/html`: a tag per asset of the graph's bundle
  (a stylesheet `<link>`, a `<script>` whose `onload` renders the component into the shadow root the SDK names by
  replacing `{{shadowRootId}}`). `graph_id` is the graph's id in langgraph.json's `ui` map: the SDK sends the
  message's `metadata.namespace`, else the `assistantId` given to `useStream`.
- `GET /ui/{graph_id}/{asset}`: the bundle's files, open without credentials (a `<script src>` sends none, and
  they hold only the project's component code), as LangGraph's server serves them.

The bundle is made at startup (`threadline.bundler`); without one, both answer 404."""

from __future__ import annotations

import html
import json
import mimetypes
import re
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import FileResponse, Response
from starlette.concurrency import run_in_threadpool

from threadline.api.common import Router
from threadline.api.ratelimit import from_trusted_proxy
from threadline.bundler import Bundle
from threadline.errors import InvalidInput, NotFound

router = Router(tags=["Generative UI"])


def _bundle(request: Request, graph_id: str) -> Bundle:
    found: Bundle | None = getattr(request.app.state, "ui_bundle", None)
    if found is None or graph_id not in found.assets:
        raise NotFound(f"no generative UI for graph {graph_id!r} (langgraph.json's 'ui' names its components)")
    return found


@router.post("/ui/{graph_id}", response_class=Response)
async def component_tags(request: Request, graph_id: str) -> Response:
    """The tags that load a graph's UI bundle and render one of its components."""
    try:
        body: Any = json.loads(await request.body() or b"null")
    except ValueError as exc:
        raise InvalidInput(f"the body must be JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        raise InvalidInput('the body must be {"name": <the component\'s name>}')
    bundle = _bundle(request, graph_id)
    # Where the browser finds the files: this server, by its absolute URL, as LangGraph.js's server answers (and its
    # API suite expects), so a page served from another origin loads them from here. (LangGraph's Python server
    # answers a path alone, `/ui/…`, which such a page resolves against its own origin.)
    host = request.headers.get("host") or request.url.netloc
    scheme = request.url.scheme
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    if forwarded in ("http", "https") and from_trusted_proxy(request, request.app.state.settings.trusted_proxies):
        scheme = forwarded  # a proxy in front terminated TLS: the page asks over https
    prefix = f"{scheme}://{host}{request.scope.get('root_path', '')}/ui/{quote(graph_id, safe='')}/"
    # The global the bundler names the bundle by: the graph id with every other character an underscore.
    global_name = "__LGUI_" + re.sub(r"[^a-zA-Z0-9]", "_", graph_id)
    # In a single-quoted attribute, as LangGraph's servers write it: the name's JSON keeps its double quotes.
    name = html.escape(json.dumps(body["name"]), quote=False).replace("'", "&#x27;")
    tags = []
    for asset in bundle.assets[graph_id]:
        url = html.escape(prefix + quote(asset, safe=""), quote=True)
        if asset.endswith(".css"):
            tags.append(f'<link rel="stylesheet" href="{url}" />')
        elif asset.endswith(".js"):
            render = f'{global_name}.render({name}, "{{{{shadowRootId}}}}")'
            tags.append(f"""<script src="{url}" onload='{render}'></script>""")
    return Response("\n".join(tags), media_type="text/html")


@router.get("/ui/{graph_id}/{asset}", response_class=FileResponse)
@router.head("/ui/{graph_id}/{asset}", response_class=FileResponse, include_in_schema=False)  # one operation id
async def asset_file(request: Request, graph_id: str, asset: str) -> Response:
    """One file of a graph's UI bundle, read whole before it is answered: `threadline dev`'s bundler rewrites
    these files in place, and a `FileResponse` sizes the file before it reads it, so a rewrite in between sent a
    body shorter than its Content-Length (a client saw the connection closed mid-body)."""
    path = _bundle(request, graph_id).asset(graph_id, asset)
    if path is None or not path.is_file():
        raise NotFound(f"no file {asset!r} in the generative UI of graph {graph_id!r}")
    if request.method == "HEAD":
        return FileResponse(path)
    try:
        content = await run_in_threadpool(path.read_bytes)
    except FileNotFoundError:  # removed since `is_file` (a rebundle)
        raise NotFound(f"no file {asset!r} in the generative UI of graph {graph_id!r}") from None
    return Response(content, media_type=mimetypes.guess_type(path.name)[0] or "text/plain")  # as FileResponse
