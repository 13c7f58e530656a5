"""The console's pages: each one a template filled from the HTTP API (`threadline.ui.client.Api`).

Pages only read. What changes something (starting, resuming or cancelling a run, putting or deleting a store
item) is done by the browser calling the API itself (`static/console.js`), so it carries the same credentials
and gets the same errors as any client.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from threadline import __version__
from threadline.ui import graph as graph_layout
from threadline.ui.client import Api, ApiError
from threadline.ui.views import chat_messages, interrupts_of, namespace_tree

if TYPE_CHECKING:
    from jinja2 import Environment

HERE = Path(__file__).parent
#: Where the console is served. Not `/ui`: that is LangGraph's path for generative UI bundles (`api/generative_ui.py`).
PATH = "/console"
PAGE_SIZE = 25
STATUSES = ("idle", "busy", "interrupted", "error")



@functools.cache
def templates() -> Environment:
    """The pages' templates; Jinja2 is imported at the first page, not when the app starts (issue 24)."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson_pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False, default=str)
    env.filters["short"] = lambda value: str(value)[:8] if value else ""
    env.filters["when"] = lambda value: str(value or "").replace("T", " ")[:19]
    return env

router = APIRouter(prefix=PATH, include_in_schema=False)


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    root = str(request.scope.get("root_path", ""))
    page = templates().get_template(template).render(
        **{"ui": root + PATH, "api": root, "version": __version__, "path": request.url.path, "request": request,
           **context})
    return HTMLResponse(page, status_code=status_code)


def failure(request: Request, error: ApiError) -> HTMLResponse:
    """An API error as a page with the same status: 401/403 ask for a key (see console.js, `signIn`)."""
    unauthorized = error.status in (401, 403)
    # A refused caller learns nothing, not even the version (/info, which names it, is behind auth too).
    return render(request, "error.html", status_code=error.status, error=error, unauthorized=unauthorized,
                  **({"version": ""} if unauthorized else {}))


def _json_param(raw: str | None, what: str) -> dict[str, Any] | None:
    if not raw or not raw.strip():
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"{what} is not valid JSON: {exc.msg}") from exc
    if not isinstance(value, dict):
        raise ApiError(400, f"{what} must be a JSON object")
    return value


@router.get("", response_class=HTMLResponse)
async def home(request: Request) -> Response:
    return RedirectResponse(str(request.scope.get("root_path", "")) + PATH + "/threads", status_code=307)


@router.get("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    return render(request, "login.html", version="")  # open to anyone (api/auth.py: CONSOLE): no version


@router.get("/threads", response_class=HTMLResponse)
async def threads(request: Request, status: str = "", metadata: str = "", page: int = 1) -> Response:
    page = max(1, page)
    try:
        filters: dict[str, Any] = {}
        if status:
            filters["status"] = status
        meta = _json_param(metadata, "metadata")
        if meta:
            filters["metadata"] = meta
        async with Api(request) as api:
            rows = await api.post("/threads/search", {**filters, "limit": PAGE_SIZE, "offset": (page - 1) * PAGE_SIZE,
                                                      "sort_by": "updated_at", "sort_order": "desc"})
            total = await api.post("/threads/count", filters)
    except ApiError as error:
        return failure(request, error)
    pages = max(1, -(-int(total) // PAGE_SIZE))

    def link(n: int) -> str:
        return "?" + urlencode({"status": status, "metadata": metadata, "page": n})

    return render(request, "threads.html", threads=rows, total=total, page=page, pages=pages, link=link,
                  status=status, metadata=metadata, statuses=STATUSES)


@router.get("/threads/{thread_id}", response_class=HTMLResponse)
async def thread(request: Request, thread_id: str, checkpoint: str = "") -> Response:
    try:
        async with Api(request) as api:
            row = await api.get(f"/threads/{thread_id}")
            state = await api.get(f"/threads/{thread_id}/state/{checkpoint}" if checkpoint
                                  else f"/threads/{thread_id}/state")
            history = await api.post(f"/threads/{thread_id}/history", {"limit": 50})
            runs = await api.get(f"/threads/{thread_id}/runs", limit=20)
            assistants = await api.post("/assistants/search", {"limit": 100})
    except ApiError as error:
        return failure(request, error)
    values = state.get("values") if isinstance(state, dict) else None
    last_assistant = next((r["assistant_id"] for r in runs if r.get("assistant_id")), None)
    graph_id = (row.get("metadata") or {}).get("graph_id")
    return render(request, "thread.html", thread=row, state=state, values=values, history=history, runs=runs,
                  checkpoint=checkpoint, messages=chat_messages(values), assistants=assistants,
                  interrupts=[] if checkpoint else interrupts_of(state),
                  chosen=last_assistant or graph_id)


@router.get("/threads/{thread_id}/runs/{run_id}", response_class=HTMLResponse)
async def thread_run(request: Request, thread_id: str, run_id: str) -> Response:
    try:
        async with Api(request) as api:
            run = await api.get(f"/threads/{thread_id}/runs/{run_id}")
    except ApiError as error:
        return failure(request, error)
    return render(request, "run.html", run=run, thread_id=thread_id,
                  stream_url=f"/threads/{thread_id}/runs/{run_id}/stream",
                  run_url=f"/threads/{thread_id}/runs/{run_id}",
                  cancel_url=f"/threads/{thread_id}/runs/{run_id}/cancel")


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def stateless_run(request: Request, run_id: str) -> Response:
    try:
        async with Api(request) as api:
            run = await api.get(f"/runs/{run_id}")
    except ApiError as error:
        return failure(request, error)
    return render(request, "run.html", run=run, thread_id=None, stream_url=f"/runs/{run_id}/stream",
                  run_url=f"/runs/{run_id}", cancel_url=f"/runs/{run_id}/cancel")


@router.get("/assistants", response_class=HTMLResponse)
async def assistants(request: Request) -> Response:
    try:
        async with Api(request) as api:
            rows = await api.post("/assistants/search", {"limit": 100, "sort_by": "assistant_id", "sort_order": "asc"})
    except ApiError as error:
        return failure(request, error)
    return render(request, "assistants.html", assistants=rows)


@router.get("/assistants/{assistant_id}", response_class=HTMLResponse)
async def assistant(request: Request, assistant_id: str) -> Response:
    try:
        async with Api(request) as api:
            row = await api.get(f"/assistants/{assistant_id}")
            versions = await api.post(f"/assistants/{assistant_id}/versions", {"limit": 20})
            try:
                drawn: Any = graph_layout.layout(await api.get(f"/assistants/{assistant_id}/graph", xray="true"))
            except ApiError as error:  # a graph that cannot be drawn still has a page
                drawn = error
    except ApiError as error:
        return failure(request, error)
    return render(request, "assistant.html", assistant=row, versions=versions, graph=drawn)


@router.get("/store", response_class=HTMLResponse)
async def store(request: Request, q: str = "") -> Response:
    namespace = [part for part in request.query_params.getlist("ns") if part]
    try:
        async with Api(request) as api:
            found = (await api.post("/store/namespaces", {"limit": 1000}))["namespaces"]
            body: dict[str, Any] = {"namespace_prefix": namespace, "limit": 50}
            if q:
                body["query"] = q
            items = (await api.post("/store/items/search", body))["items"]
    except ApiError as error:
        return failure(request, error)
    semantic = bool(getattr(request.app.state.project, "store_index", None))
    return render(request, "store.html", namespaces=namespace_tree(found), namespace=namespace, items=items, q=q,
                  semantic=semantic, ns_link=lambda parts: "?" + urlencode([("ns", p) for p in parts]))


@router.get("/queue", response_class=HTMLResponse)
async def queue(request: Request) -> Response:
    try:
        async with Api(request) as api:
            figures = await api.get("/metrics", format="json")
            failures = await api.post("/runs/search", {"status": "error", "limit": 10})
            pending = await api.post("/runs/search", {"status": "pending", "limit": 20})
            running = await api.post("/runs/search", {"status": "running", "limit": 20})
    except ApiError as error:
        return failure(request, error)
    return render(request, "queue.html", figures=figures, failures=failures, pending=pending, running=running)
