"""Authorization (`@auth.on…` handlers of langgraph.json's `auth`): two users, each alone with what they made.

The project (tests/authz_project) is LangGraph's owner-only recipe, written as a user writes it: a global
`@auth.on` stamps `metadata.owner` on whatever is created and filters everything by it; `@auth.on.store`
puts each user's items under their identity. User A makes one of everything (the `world` fixture); user B
then tries every route on it. What B must see, on every backend:

- A's thread, runs, assistant and crons do not exist: 404, never 403 (which would confirm they do) and never
  200; nothing of A's changes; B's searches and counts hold none of it. A, meanwhile, reaches all of it.
- A thread id A holds is taken (409) whatever B's `if_exists`; what B creates is B's (`metadata.owner`).
- B's store is B's: A's ("docs", "k") is not there for B, and B's writes do not touch it.
- A2A, MCP, Protocol v2 and the console answer B the same way as the REST routes do.

The module's tests share one started app per backend (tests/shared_app.py): each test's A and B are users of
its own (`a-<id>`, `b-<id>`), so what earlier tests' users made is nobody's this test can see.

`test_every_route_is_covered` walks the app's routes: a new route fails it until it is added to `COVERED`
(with the test that covers it) or to `NO_USER_RESOURCE` (with why it holds nothing of anyone's).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.services import Backend
from tests.shared_app import shared_app
from tests.test_auth import our_routes
from tests.test_crons import START, Clock
from threadline.api.app import create_app
from threadline.api.mcp import tool_name
from threadline.core.runtime import Runtime
from threadline.settings import Settings

PROJECT = Path(__file__).parent / "authz_project" / "langgraph.json"
NEVER = "0 0 1 1 *"  # a schedule that does not come round during a test
SECRET = "a-secret-7f3c"  # what A writes into its things: B must never read it
BOUND = 60.0  # seconds: no request of a test waits longer than this
MCP_ACCEPT = {"accept": "application/json, text/event-stream"}


pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the mark above reaches the module's plain function too (test_every_route_is_covered)
              pytest.mark.filterwarnings("ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async")]

backend, served, http = shared_app()


@pytest.fixture(scope="module")
def module_settings(module_backend: Backend) -> Settings:
    return Settings(config=str(PROJECT), workers=2, heartbeat_seconds=5.0, **module_backend.settings())


# --- a caller ------------------------------------------------------------------------------------------------


@dataclass
class Answer:
    """What the app answered a raw request (for an event stream: what it had sent when the client left);
    status 0 if it answered nothing in time."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


@dataclass
class User:
    """One caller (`Bearer user-<name>`). `request` goes through httpx; `ask` straight to the ASGI app, and
    comes back as soon as an event stream has opened (a stream B should never get would otherwise never end)."""

    name: str
    http: httpx.AsyncClient
    app: Any

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer user-{self.name}"}

    async def request(self, method: str, path: str, body: Any = None, *,
                      headers: dict[str, str] | None = None) -> httpx.Response:
        return await asyncio.wait_for(self.http.request(method, path, json=body,
                                                        headers={**self.headers, **(headers or {})}), BOUND)

    async def ok(self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None) -> Any:
        """The answer's JSON (None without a body), after checking it is a success."""
        response = await self.request(method, path, body, headers=headers)
        assert 200 <= response.status_code < 300, (self.name, method, path, response.status_code, response.text)
        return response.json() if response.content else None

    async def ask(self, method: str, path: str, body: Any = None, *,
                  until: Callable[[bytes], bool] | None = None) -> Answer:
        """`until`: for an event stream, read on until what came so far satisfies it."""
        content = json.dumps(body).encode() if body is not None else b""
        start: dict[str, Any] = {}
        chunks: list[bytes] = []
        answered, leave = asyncio.Event(), asyncio.Event()
        inbox = [{"type": "http.request", "body": content, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if inbox:
                return inbox.pop()
            await leave.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    answered.set()
            content_type = dict(start.get("headers") or []).get(b"content-type", b"")
            if content_type.startswith(b"text/event-stream") and (until is None or until(b"".join(chunks))):
                answered.set()

        scope = _http_scope(method, path, [(b"authorization", f"Bearer user-{self.name}".encode())], content)
        await _run_until(self.app(scope, receive, send), answered, leave)
        return Answer(start.get("status", 0), b"".join(chunks))


def _http_scope(method: str, path: str, headers: list[tuple[bytes, bytes]], content: bytes) -> dict[str, Any]:
    url = httpx.URL(path)
    headers = [(b"host", b"threadline"), (b"content-length", str(len(content)).encode()), *headers]
    if content:
        headers.append((b"content-type", b"application/json"))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": url.path, "raw_path": url.raw_path.split(b"?")[0], "query_string": url.query, "root_path": "",
            "headers": headers, "server": ("threadline", 80), "client": ("127.0.0.1", 1)}


async def _run_until(call: Any, answered: asyncio.Event, leave: asyncio.Event) -> None:
    """Run one ASGI call until `answered` (at most BOUND seconds), then let the client leave and the app end."""
    task = asyncio.ensure_future(call)
    try:
        await asyncio.wait_for(answered.wait(), BOUND)
    except TimeoutError:
        pass  # the caller sees what was (not) answered
    finally:
        leave.set()
        try:
            await asyncio.wait_for(task, 10)
        except Exception:  # noqa: BLE001 - the app's own failure shows in what it answered; a hang is cut short
            task.cancel()


@pytest.fixture
def a(http: httpx.AsyncClient, app: Any) -> User:
    return User(f"a-{uuid.uuid4().hex[:8]}", http, app)


@pytest.fixture
def b(http: httpx.AsyncClient, app: Any) -> User:
    return User(f"b-{uuid.uuid4().hex[:8]}", http, app)


Call = tuple[str, str] | tuple[str, str, Any]


async def answers(user: User, calls: list[Call], expected: Callable[[int], bool],
                  labels: dict[str, str]) -> list[str]:
    """Each call the user's answer to was not `expected`, as `METHOD path -> status body` (ids as names)."""
    wrong = []
    for method, path, *body in calls:
        answer = await user.ask(method, path, body[0] if body else None)
        if not expected(answer.status):
            shown = f"{method} {path} -> {answer.status} {answer.text[:160]!r}"
            for value, name in labels.items():
                shown = shown.replace(value, name)
            wrong.append(shown if answer.status else shown + " (no answer: an open stream or a hang)")
    return wrong


def not_found(status: int) -> bool:
    return status == 404


def success(status: int) -> bool:
    return 200 <= status < 300


# --- what A makes ---------------------------------------------------------------------------------------------


@dataclass
class World:
    """A's things: a thread with a finished run of `whoami`, a second thread with runs waiting an hour to
    start, an assistant, a thread cron and a stateless cron, and a store item."""

    thread_id: str
    run_id: str
    checkpoint_id: str
    waiting_thread_id: str
    pending_run_ids: list[str]
    assistant_id: str
    thread_cron_id: str
    cron_id: str
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.labels = {self.thread_id: "{A's thread}", self.run_id: "{A's run}", self.checkpoint_id: "{checkpoint}",
                       self.waiting_thread_id: "{A's 2nd thread}", self.assistant_id: "{A's assistant}",
                       self.thread_cron_id: "{A's thread cron}", self.cron_id: "{A's cron}",
                       **{r: f"{{A's pending run {n}}}" for n, r in enumerate(self.pending_run_ids, 1)}}


@pytest_asyncio.fixture(loop_scope="module")
async def world(a: User) -> World:
    thread = await a.ok("POST", "/threads", {"metadata": {"title": SECRET}})
    tid = thread["thread_id"]
    assert thread["metadata"]["owner"] == a.name
    out = await a.ok("POST", f"/threads/{tid}/runs/wait", {"assistant_id": "whoami", "input": {"message": SECRET}})
    assert out["seen"]["user_id"] == a.name
    (run,) = await a.ok("GET", f"/threads/{tid}/runs")
    checkpoint_id = (await a.ok("GET", f"/threads/{tid}/state"))["checkpoint"]["checkpoint_id"]
    waiting = (await a.ok("POST", "/threads", {}))["thread_id"]
    pending = [(await a.ok("POST", f"/threads/{waiting}/runs", {
        "assistant_id": "whoami", "input": {}, "after_seconds": 3600, "multitask_strategy": "enqueue"}))["run_id"]
               for _ in range(3)]
    assistant = await a.ok("POST", "/assistants", {"graph_id": "whoami", "name": "a-private",
                                                   "metadata": {"title": SECRET}})
    assert assistant["metadata"]["owner"] == a.name
    thread_cron = await a.ok("POST", f"/threads/{tid}/runs/crons", {"assistant_id": "whoami", "schedule": NEVER})
    cron = await a.ok("POST", "/runs/crons", {"assistant_id": "whoami", "schedule": NEVER})
    await a.ok("PUT", "/store/items", {"namespace": ["docs"], "key": "k", "value": {"text": SECRET}})
    return World(tid, run["run_id"], checkpoint_id, waiting, pending, assistant["assistant_id"],
                 thread_cron["cron_id"], cron["cron_id"])


async def run_ids_of(user: User, thread_id: str) -> list[str]:
    return [r["run_id"] for r in await user.ok("GET", f"/threads/{thread_id}/runs?limit=100")]


# --- threads ----------------------------------------------------------------------------------------------------


def thread_calls(t: str, cp: str, metadata: dict[str, str]) -> list[Call]:
    """Every route on one thread (the delete last); the writes put `metadata` in its metadata and state."""
    return [
        ("GET", f"/threads/{t}"),
        ("PATCH", f"/threads/{t}", {"metadata": metadata}),
        ("POST", f"/threads/{t}/copy", {}),
        ("GET", f"/threads/{t}/state"),
        ("POST", f"/threads/{t}/state", {"values": {"message": metadata["title"]}}),
        ("GET", f"/threads/{t}/state/{cp}"),
        ("POST", f"/threads/{t}/state/checkpoint", {"checkpoint": {"checkpoint_id": cp}}),
        ("GET", f"/threads/{t}/history"),
        ("POST", f"/threads/{t}/history", {"limit": 5}),
        ("GET", f"/threads/{t}/stream"),
        ("DELETE", f"/threads/{t}"),
    ]


async def test_another_users_thread_is_not_found(a: User, b: User, world: World) -> None:
    t, cp = world.thread_id, world.checkpoint_id
    state_before = await a.ok("GET", f"/threads/{t}/state")
    history_before = await a.ok("GET", f"/threads/{t}/history")
    wrong = await answers(b, thread_calls(t, cp, {"owner": b.name, "title": "b was here"}), not_found, world.labels)
    assert not wrong, "B reached A's thread:\n" + "\n".join(wrong)
    # Nothing of A's changed.
    thread = await a.ok("GET", f"/threads/{t}")
    assert thread["metadata"]["title"] == SECRET and thread["metadata"]["owner"] == a.name
    assert await a.ok("GET", f"/threads/{t}/state") == state_before
    assert await a.ok("GET", f"/threads/{t}/history") == history_before
    assert [r["thread_id"] for r in await a.ok("POST", "/threads/search", {"limit": 100})].count(t) == 1


async def test_the_owner_reaches_its_thread(a: User, world: World) -> None:
    t, cp = world.thread_id, world.checkpoint_id
    wrong = await answers(a, thread_calls(t, cp, {"title": "renamed"}), success, world.labels)
    assert not wrong, "A could not reach its own thread:\n" + "\n".join(wrong)
    assert (await a.request("GET", f"/threads/{t}")).status_code == 404  # the DELETE was real


async def test_thread_searches_counts_and_prunes_are_the_callers_own(a: User, b: User, world: World) -> None:
    mine = {world.thread_id, world.waiting_thread_id}
    for body in ({"limit": 100}, {"ids": sorted(mine)}, {"metadata": {"owner": a.name}},
                 {"metadata": {"title": SECRET}}, {"values": {"message": SECRET}}, {"status": "busy"}):
        found = await b.request("POST", "/threads/search", body)
        assert found.status_code == 200 and found.json() == [], (body, found.text)
        assert found.headers["x-pagination-total"] == "0", body
    assert await b.ok("POST", "/threads/count", {}) == 0
    assert await b.ok("POST", "/threads/count", {"metadata": {"owner": a.name}}) == 0
    for strategy in ("delete", "keep_latest"):
        pruned = await b.ok("POST", "/threads/prune", {"thread_ids": sorted(mine), "strategy": strategy})
        assert pruned["pruned_count"] == 0, strategy
    # A sees exactly its own, and the prunes above left them whole.
    found = await a.request("POST", "/threads/search", {"limit": 100})
    assert {t["thread_id"] for t in found.json()} == mine
    assert found.headers["x-pagination-total"] == "2"
    assert await a.ok("POST", "/threads/count", {}) == 2
    assert len(await a.ok("GET", f"/threads/{world.thread_id}/history")) > 0
    assert (await a.ok("POST", "/threads/prune", {"thread_ids": [world.thread_id]}))["pruned_count"] == 1


async def test_a_thread_id_another_user_holds_is_taken(a: User, b: User, world: World) -> None:
    for if_exists in ("raise", "do_nothing"):
        taken = await b.request("POST", "/threads", {"thread_id": world.thread_id, "if_exists": if_exists})
        assert taken.status_code == 409, (if_exists, taken.status_code, taken.text)
        assert SECRET not in taken.text
    assert (await a.ok("GET", f"/threads/{world.thread_id}"))["metadata"]["owner"] == a.name
    again = await a.ok("POST", "/threads", {"thread_id": world.thread_id, "if_exists": "do_nothing"})
    assert again["metadata"]["title"] == SECRET  # the owner gets its thread back


async def test_what_b_creates_is_bs(a: User, b: User, world: World) -> None:
    plain = await b.ok("POST", "/threads", {})
    no_metadata = await b.ok("POST", "/threads", {"metadata": None})
    claimed = await b.ok("POST", "/threads", {"metadata": {"owner": a.name, "title": "not really a's"}})
    for thread in (plain, no_metadata, claimed):
        assert thread["metadata"]["owner"] == b.name, thread
    # A run that creates its thread: the thread is B's, and the graph runs as B.
    new_id = str(uuid.uuid4())
    out = await b.ok("POST", f"/threads/{new_id}/runs/wait",
                     {"assistant_id": "whoami", "input": {}, "if_not_exists": "create"})
    assert out["seen"]["user_id"] == b.name
    assert (await b.ok("GET", f"/threads/{new_id}"))["metadata"]["owner"] == b.name
    # A stateless run (kept, so its thread can be looked at).
    stateless = await b.request("POST", "/runs/wait", {"assistant_id": "whoami", "input": {}, "on_completion": "keep"})
    assert stateless.status_code == 200 and stateless.json()["seen"]["user_id"] == b.name, stateless.text
    kept_thread = stateless.headers["content-location"].split("/")[2]
    assert (await b.ok("GET", f"/threads/{kept_thread}"))["metadata"]["owner"] == b.name
    assert (await b.ok("POST", "/runs/wait", {"assistant_id": "whoami", "input": {}}))["seen"]["user_id"] == b.name
    # None of it is A's.
    for thread_id in (plain["thread_id"], claimed["thread_id"], new_id, kept_thread):
        assert (await a.request("GET", f"/threads/{thread_id}")).status_code == 404, thread_id
    assert {t["thread_id"] for t in await a.ok("POST", "/threads/search", {"limit": 100})} == {
        world.thread_id, world.waiting_thread_id}


async def test_another_users_thread_cannot_be_reached_through_ones_own(a: User, b: User, world: World) -> None:
    """B names A's thread or checkpoint inside requests on B's own thread: the path's thread is the one used."""
    t, cp = world.thread_id, world.checkpoint_id
    mine = (await b.ok("POST", "/threads", {}))["thread_id"]
    state_before = await a.ok("GET", f"/threads/{t}/state")
    smuggled = {"configurable": {"thread_id": t, "checkpoint_id": cp}}
    for method, path, body in (
            ("POST", f"/threads/{mine}/state/checkpoint", {"checkpoint": {"thread_id": t, "checkpoint_id": cp}}),
            ("GET", f"/threads/{mine}/state/{cp}", None),
            ("POST", f"/threads/{mine}/history", {"checkpoint": {"thread_id": t}}),
            ("POST", f"/threads/{mine}/state", {"values": {"message": "b was here"}, "checkpoint": {"thread_id": t}}),
            ("PATCH", f"/threads/{mine}", {"values": {"message": "b was here"}, "checkpoint": {"thread_id": t}}),
            ("POST", f"/threads/{mine}/runs/wait", {"assistant_id": "whoami", "input": {}, "config": smuggled}),
            ("POST", f"/threads/{mine}/runs/wait", {"assistant_id": "whoami", "input": {},
                                                    "checkpoint": {"thread_id": t, "checkpoint_id": cp}}),
            ("POST", "/runs/wait", {"assistant_id": "whoami", "input": {}, "config": smuggled}),
            ("GET", f"/threads/{mine}/runs/{world.run_id}", None),
            ("POST", f"/threads/{mine}/runs/{world.pending_run_ids[0]}/cancel", None)):
        answer = await b.ask(method, path, body)
        assert 0 < answer.status < 500 and SECRET not in answer.text, (method, path, answer.status, answer.text)
    assert await a.ok("GET", f"/threads/{t}/state") == state_before
    assert await run_ids_of(a, t) == [world.run_id]
    assert (await a.ok("GET", f"/runs/{world.pending_run_ids[0]}"))["status"] == "pending"


# --- runs -------------------------------------------------------------------------------------------------------


async def test_another_users_runs_are_not_found(a: User, b: User, world: World) -> None:
    t, r, w = world.thread_id, world.run_id, world.waiting_thread_id
    p1, p2 = world.pending_run_ids[:2]
    wrong = await answers(b, [
        ("GET", f"/threads/{t}/runs"),
        ("GET", f"/threads/{t}/runs/{r}"),
        ("GET", f"/threads/{t}/runs/{r}/join"),
        ("GET", f"/threads/{t}/runs/{r}/wait"),
        ("GET", f"/threads/{t}/runs/{r}/stream"),
        ("POST", f"/threads/{w}/runs/{p1}/cancel"),
        ("POST", f"/threads/{w}/runs/{p1}/cancel?wait=true&action=rollback"),
        ("DELETE", f"/threads/{t}/runs/{r}"),
        ("GET", f"/runs/{r}"),
        ("GET", f"/runs/{r}/wait"),
        ("GET", f"/runs/{r}/stream"),
        ("POST", f"/runs/{p2}/cancel"),
        ("DELETE", f"/runs/{r}"),
        ("DELETE", f"/runs/{p2}"),
    ], not_found, world.labels)
    assert not wrong, "B reached A's runs:\n" + "\n".join(wrong)
    assert (await a.ok("GET", f"/threads/{t}/runs/{r}"))["status"] == "success"
    for run_id in world.pending_run_ids:
        assert (await a.ok("GET", f"/runs/{run_id}"))["status"] == "pending"


async def test_the_owner_reaches_its_runs(a: User, world: World) -> None:
    t, r, w = world.thread_id, world.run_id, world.waiting_thread_id
    p1, p2, p3 = world.pending_run_ids
    wrong = await answers(a, [
        ("GET", f"/threads/{t}/runs"),
        ("GET", f"/threads/{t}/runs/{r}"),
        ("GET", f"/threads/{t}/runs/{r}/join"),
        ("GET", f"/threads/{t}/runs/{r}/wait"),
        ("GET", f"/threads/{t}/runs/{r}/stream"),
        ("GET", f"/runs/{r}"),
        ("GET", f"/runs/{r}/wait"),
        ("GET", f"/runs/{r}/stream"),
        ("POST", f"/threads/{w}/runs/{p1}/cancel"),
        ("POST", f"/runs/{p2}/cancel"),
        ("POST", "/runs/cancel", {"run_ids": [p3]}),
        ("DELETE", f"/runs/{p2}"),
        ("DELETE", f"/threads/{t}/runs/{r}"),
    ], success, world.labels)
    assert not wrong, "A could not reach its own runs:\n" + "\n".join(wrong)
    assert await run_ids_of(a, t) == []


async def test_runs_cannot_be_started_on_another_users_thread(a: User, b: User, world: World) -> None:
    t = world.thread_id
    run = {"assistant_id": "whoami", "input": {"message": "b was here"}}
    wrong = await answers(b, [
        ("POST", f"/threads/{t}/runs", run),
        ("POST", f"/threads/{t}/runs/wait", run),
        ("POST", f"/threads/{t}/runs/stream", run),
        ("POST", f"/threads/{t}/runs", {**run, "if_not_exists": "create"}),
        ("POST", f"/threads/{t}/runs", {**run, "multitask_strategy": "interrupt"}),
        ("POST", "/runs", {**run, "thread_id": t}),
        ("POST", "/runs/wait", {**run, "thread_id": t}),
        ("POST", "/runs/stream", {**run, "thread_id": t}),
        ("POST", "/runs/batch", [{**run, "thread_id": t}]),
    ], not_found, world.labels)
    assert not wrong, "B started runs on A's thread:\n" + "\n".join(wrong)
    assert await run_ids_of(a, t) == [world.run_id]
    assert (await a.ok("GET", f"/threads/{t}/state"))["values"]["message"] == SECRET
    # A starts runs on its own thread by the same routes.
    mine = {"assistant_id": "whoami", "input": {"message": "again"}, "multitask_strategy": "enqueue"}
    wrong = await answers(a, [
        ("POST", f"/threads/{t}/runs/wait", mine),
        ("POST", "/runs/wait", {**mine, "thread_id": t}),
        ("POST", "/runs/batch", [{"assistant_id": "whoami", "input": {}}]),
    ], success, world.labels)
    assert not wrong, "A could not run on its own thread:\n" + "\n".join(wrong)


async def test_run_searches_and_cancels_leave_another_users_runs_alone(a: User, b: User, world: World) -> None:
    mine = {world.run_id, *world.pending_run_ids}
    assert not {r["run_id"] for r in await b.ok("POST", "/runs/search", {"limit": 100})} & mine
    searches: list[dict[str, Any]] = [{"thread_id": world.thread_id}, {"metadata": {"owner": a.name}},
                                      {"status": "pending"}]
    for search in searches:
        found = await b.request("POST", "/runs/search", {**search, "limit": 100})
        assert found.status_code in (200, 404), (search, found.status_code, found.text)
        assert found.status_code == 404 or found.json() == [], (search, found.text)
    cancels: list[dict[str, Any]] = [{"run_ids": world.pending_run_ids}, {"thread_id": world.waiting_thread_id},
                                     {"run_ids": world.pending_run_ids[:1], "thread_id": world.waiting_thread_id}]
    for cancel in cancels:
        refused = await b.request("POST", "/runs/cancel", cancel)
        assert refused.status_code == 404, (cancel, refused.status_code, refused.text)
    # A status alone names no runs of A's (B has none to cancel: 204, or 404 as LangGraph's server says).
    for status in ("pending", "all"):
        assert (await b.request("POST", "/runs/cancel", {"status": status})).status_code in (204, 404)
    for run_id in world.pending_run_ids:
        assert (await a.ok("GET", f"/runs/{run_id}"))["status"] == "pending"
    assert {r["run_id"] for r in await a.ok("POST", "/runs/search", {"limit": 100})} >= mine
    await a.ok("POST", "/runs/cancel", {"status": "pending"})
    for run_id in world.pending_run_ids:
        assert (await a.ok("GET", f"/runs/{run_id}"))["status"] != "pending"


# --- assistants and agents -----------------------------------------------------------------------------------


async def test_another_users_assistant_is_not_found(a: User, b: User, world: World) -> None:
    x, namespace = world.assistant_id, "child"
    calls: list[Call] = [
        ("GET", f"/assistants/{x}"),
        ("PATCH", f"/assistants/{x}", {"metadata": {"owner": b.name}}),
        ("GET", f"/assistants/{x}/schemas"),
        ("GET", f"/assistants/{x}/graph"),
        ("GET", f"/assistants/{x}/subgraphs"),
        ("GET", f"/assistants/{x}/subgraphs/{namespace}"),
        ("POST", f"/assistants/{x}/versions", {}),
        ("POST", f"/assistants/{x}/latest", {"version": 1}),
        ("GET", f"/agents/{x}"),
        ("GET", f"/agents/{x}/schemas"),
        ("GET", f"/a2a/{x}"),
        ("GET", f"/a2a/{x}/"),
        ("GET", f"/a2a/{x}/.well-known/agent-card.json"),
        ("GET", f"/a2a/{x}/.well-known/agent.json"),
        ("GET", f"/.well-known/agent-card.json?assistant_id={x}"),
    ]
    wrong = await answers(b, [*calls, ("DELETE", f"/assistants/{x}?delete_threads=true")], not_found, world.labels)
    assert not wrong, "B reached A's assistant:\n" + "\n".join(wrong)
    assistant = await a.ok("GET", f"/assistants/{x}")
    assert assistant["metadata"] == {"title": SECRET, "owner": a.name} and assistant["version"] == 1
    wrong = await answers(a, [*calls[:-2], ("DELETE", f"/assistants/{x}")], success, world.labels)
    assert not wrong, "A could not reach its own assistant:\n" + "\n".join(wrong)


async def test_another_users_assistant_cannot_be_run_or_taken(a: User, b: User, world: World) -> None:
    x = world.assistant_id
    mine = (await b.ok("POST", "/threads", {}))["thread_id"]
    run = {"assistant_id": x, "input": {}}
    wrong = await answers(b, [
        ("POST", f"/threads/{mine}/runs/wait", run),
        ("POST", "/runs/wait", run),
        ("POST", "/runs", run),
        ("POST", "/runs/crons", {"assistant_id": x, "schedule": NEVER}),
        ("POST", f"/threads/{mine}/runs/crons", {"assistant_id": x, "schedule": NEVER}),
    ], not_found, {**world.labels, mine: "{B's thread}"})
    assert not wrong, "B ran A's assistant:\n" + "\n".join(wrong)
    assert await run_ids_of(b, mine) == []
    for if_exists in ("raise", "do_nothing"):
        taken = await b.request("POST", "/assistants", {"assistant_id": x, "graph_id": "whoami",
                                                        "if_exists": if_exists})
        assert taken.status_code == 409 and SECRET not in taken.text, (if_exists, taken.status_code, taken.text)
    own = await b.ok("POST", "/assistants", {"graph_id": "whoami", "name": "b-own", "metadata": {"owner": a.name}})
    assert own["metadata"]["owner"] == b.name
    assert (await a.request("GET", f"/assistants/{own['assistant_id']}")).status_code == 404
    # A runs its own assistant, as itself.
    assert (await a.ok("POST", "/runs/wait", run))["seen"]["user_id"] == a.name


async def test_assistant_and_agent_searches_are_the_callers_own(a: User, b: User, world: World) -> None:
    x = world.assistant_id
    for who, sees in ((a, True), (b, False)):
        ids = [s["assistant_id"] for s in await who.ok("POST", "/assistants/search", {"limit": 1000})]
        assert (x in ids) is sees, who.name
        agents = [s["agent_id"] for s in await who.ok("POST", "/agents/search", {"limit": 1000})]
        assert (x in agents) is sees, who.name
        by_owner = await who.ok("POST", "/assistants/search", {"metadata": {"owner": a.name}, "limit": 1000})
        assert [s["assistant_id"] for s in by_owner] == ([x] if sees else []), who.name
        assert await who.ok("POST", "/assistants/count", {"metadata": {"title": SECRET}}) == int(sees)
    # Whatever both see of the graphs' own assistants, A sees one more.
    counts = [await who.ok("POST", "/assistants/count", {}) for who in (a, b)]
    assert counts[0] - counts[1] == 1, counts
    searched = await b.request("POST", "/assistants/search", {"limit": 1000})
    assert searched.headers["x-pagination-total"] == str(counts[1])


# --- crons --------------------------------------------------------------------------------------------------------


async def test_another_users_crons_are_not_found(a: User, b: User, world: World) -> None:
    calls: list[Call] = []
    for c in (world.thread_cron_id, world.cron_id):
        calls += [("GET", f"/runs/crons/{c}"), ("PATCH", f"/runs/crons/{c}", {"schedule": "* * * * *"})]
    deletes: list[Call] = [("DELETE", f"/runs/crons/{c}") for c in (world.thread_cron_id, world.cron_id)]
    wrong = await answers(b, [
        *calls, *deletes,
        ("POST", f"/threads/{world.thread_id}/runs/crons", {"assistant_id": "whoami", "schedule": "* * * * *"}),
    ], not_found, world.labels)
    assert not wrong, "B reached A's crons:\n" + "\n".join(wrong)
    crons = await a.ok("POST", "/runs/crons/search", {"limit": 100})
    assert {c["cron_id"] for c in crons} == {world.thread_cron_id, world.cron_id}
    assert {c["schedule"] for c in crons} == {NEVER}
    wrong = await answers(a, [*calls, *deletes], success, world.labels)
    assert not wrong, "A could not reach its own crons:\n" + "\n".join(wrong)


async def test_cron_searches_and_counts_are_the_callers_own(a: User, b: User, world: World) -> None:
    mine = {world.thread_cron_id, world.cron_id}
    for body in ({}, {"thread_id": world.thread_id}, {"metadata": {"owner": a.name}}):
        found = await b.request("POST", "/runs/crons/search", {**body, "limit": 100})
        assert found.status_code == 200 and found.json() == [], (body, found.text)
        assert await b.ok("POST", "/runs/crons/count", body) == 0, body
    own = await b.ok("POST", "/runs/crons", {"assistant_id": "whoami", "schedule": NEVER})
    assert own["metadata"]["owner"] == b.name
    assert [c["cron_id"] for c in await b.ok("POST", "/runs/crons/search", {"limit": 100})] == [own["cron_id"]]
    assert {c["cron_id"] for c in await a.ok("POST", "/runs/crons/search", {"limit": 100})} == mine
    assert await a.ok("POST", "/runs/crons/count", {}) == 2
    assert await a.ok("POST", "/runs/crons/count", {"thread_id": world.thread_id}) == 1
    assert (await a.request("GET", f"/runs/crons/{own['cron_id']}")).status_code == 404


async def test_an_agents_own_client_calls_as_its_runs_caller(a: User, b: User, world: World) -> None:
    """`get_client()` without a URL in A's run reaches this server in-process, unauthenticated and authorized as
    A, as on LangGraph's server: it sees A's threads only, what it makes is A's, a run it starts runs as A,
    B's thread is not found, and credentials put on the client change none of it."""
    theirs = (await b.ok("POST", "/threads", {}))["thread_id"]
    out = await a.ok("POST", f"/threads/{world.thread_id}/runs/wait",
                     {"assistant_id": "caller", "input": {"other_thread": theirs}})
    assert out["seen"] == {"owners": [a.name], "made_owner": a.name, "nested_user": a.name,
                           "other_thread": "NotFoundError", "posing_owners": [a.name]}, out
    made = await a.ok("POST", "/threads/search", {"metadata": {"made_by": "caller"}})
    assert len(made) == 1 and made[0]["metadata"]["owner"] == a.name
    assert await b.ok("POST", "/threads/search", {"metadata": {"made_by": "caller"}}) == []


async def test_cron_ticks_run_as_their_creator(a: User, b: User, runtime: Runtime) -> None:
    """The scheduler fires a tick as the cron's creator: `threads.create_run` is asked as A, so the run and the
    thread a stateless cron makes are A's (the graph sees A), and B finds none of them."""
    crons = runtime.crons
    assert crons is not None
    clock, real = Clock(START), crons.clock
    crons.clock = clock
    tid = (await a.ok("POST", "/threads", {}))["thread_id"]
    tick = {"assistant_id": "whoami", "schedule": "* * * * *", "input": {"message": "tick"}}
    made = [await a.ok("POST", f"/threads/{tid}/runs/crons", tick),
            await a.ok("POST", "/runs/crons", {**tick, "on_run_completed": "keep"})]
    clock.advance(minutes=1)
    try:
        await asyncio.wait_for(crons.run_due(), BOUND)
    finally:  # on the shared app, the crons of later tests' worlds (`NEVER`) must not come due (these two are
        crons.clock = real  # next due a year from now)
    for cron in made:
        (run,) = await a.ok("POST", "/runs/search", {"metadata": {"cron_id": cron["cron_id"]}, "limit": 10})
        done = await a.ok("GET", f"/runs/{run['run_id']}/wait")
        assert done["values"]["seen"]["user_id"] == a.name, done
        assert (await a.ok("GET", f"/threads/{run['thread_id']}"))["metadata"]["owner"] == a.name
        assert (await b.request("GET", f"/threads/{run['thread_id']}")).status_code == 404
        assert (await b.request("GET", f"/runs/{run['run_id']}")).status_code == 404
        assert await b.ok("POST", "/runs/search", {"metadata": {"cron_id": cron["cron_id"]}}) == []


# --- the store ------------------------------------------------------------------------------------------------------


async def test_store_items_are_the_callers_own(a: User, b: User, world: World) -> None:
    assert await b.ok("GET", "/store/items?namespace=docs&key=k") is None
    assert await b.ok("GET", f"/store/items?namespace={a.name}.docs&key=k") is None  # A's real namespace, named
    for prefix in ([], ["docs"], [a.name], [a.name, "docs"]):
        found = await b.ok("POST", "/store/items/search", {"namespace_prefix": prefix, "limit": 100})
        assert found["items"] == [], (prefix, found)
    assert SECRET not in json.dumps(await b.ok("POST", "/store/items/search", {"query": SECRET}))
    for body in ({}, {"prefix": [a.name]}, {"suffix": ["docs"]}):
        namespaces = (await b.ok("POST", "/store/namespaces", body))["namespaces"]
        assert not any(a.name in ns for ns in namespaces), (body, namespaces)
    # B's writes and deletes land in B's own namespace.
    await b.ok("DELETE", "/store/items", {"namespace": ["docs"], "key": "k"})
    await b.ok("DELETE", "/store/items", {"namespace": [a.name, "docs"], "key": "k"})
    await b.ok("PUT", "/store/items", {"namespace": [a.name, "docs"], "key": "k", "value": {"text": "b's, not a's"}})
    await b.ok("PUT", "/store/items", {"namespace": ["docs"], "key": "k", "value": {"text": "b's"}})
    assert (await b.ok("GET", "/store/items?namespace=docs&key=k"))["value"] == {"text": "b's"}
    # A's item is whole, and where A reads it.
    item = await a.ok("GET", "/store/items?namespace=docs&key=k")
    assert item["value"] == {"text": SECRET} and item["namespace"] == [a.name, "docs"]
    found = await a.ok("POST", "/store/items/search", {"namespace_prefix": ["docs"]})
    assert [i["value"] for i in found["items"]] == [{"text": SECRET}]
    assert (await a.ok("POST", "/store/namespaces", {}))["namespaces"] == [[a.name, "docs"]]
    await a.ok("DELETE", "/store/items", {"namespace": ["docs"], "key": "k"})
    assert await a.ok("GET", "/store/items?namespace=docs&key=k") is None
    assert (await b.ok("GET", "/store/items?namespace=docs&key=k"))["value"] == {"text": "b's"}


# --- A2A --------------------------------------------------------------------------------------------------------------


async def rpc(user: User, path: str, method: str, params: Any) -> dict[str, Any]:
    response = await user.request("POST", path,
                                  {"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                                  headers={"accept": "application/json, text/event-stream"})
    assert response.status_code == 200, (method, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), (method, response.text)
    return response.json()


def message(text: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "message", "role": "user", "messageId": str(uuid.uuid4()),
            "parts": [{"kind": "text", "text": text}], **extra}


async def test_a2a_tasks_and_contexts_are_the_callers_own(a: User, b: User, world: World) -> None:
    """Each talks to an echo assistant of its own: the graphs' own assistants have no owner, so the owner-only
    filter hides them from everyone's reads (as on LangGraph's server), and A2A reads the assistant."""
    a_echo = (await a.ok("POST", "/assistants", {"graph_id": "echo", "name": "a-echo"}))["assistant_id"]
    b_echo = (await b.ok("POST", "/assistants", {"graph_id": "echo", "name": "b-echo"}))["assistant_id"]
    context = str(uuid.uuid4())
    sent = await rpc(a, f"/a2a/{a_echo}", "message/send", {"message": message(SECRET, contextId=context)})
    assert "result" in sent, sent
    task = sent["result"]
    assert task["status"]["state"] == "completed" and task["contextId"] == context, sent
    assert (await a.ok("GET", f"/threads/{context}"))["metadata"]["owner"] == a.name
    # B cannot continue A's context (through B's own assistant), nor read, cancel or list A's task.
    v1_send = {"message": {"role": "ROLE_USER", "messageId": str(uuid.uuid4()), "contextId": context,
                           "parts": [{"text": "b"}]}}
    for path, method, params in (
            (f"/a2a/{b_echo}", "message/send", {"message": message("b was here", contextId=context)}),
            (f"/a2a/{b_echo}/", "SendMessage", v1_send),
            (f"/a2a/{b_echo}", "message/send", {"message": message("b", contextId=context, taskId=task["id"])}),
            (f"/a2a/{b_echo}", "tasks/get", {"id": task["id"]}),
            (f"/a2a/{a_echo}", "message/send", {"message": message("b was here", contextId=context)}),
            (f"/a2a/{a_echo}/", "message/send", {"message": message("b was here")}),
            (f"/a2a/{a_echo}", "tasks/get", {"id": task["id"]}),
            (f"/a2a/{a_echo}", "GetTask", {"id": task["id"]}),
            (f"/a2a/{a_echo}", "tasks/get", {"id": task["id"].split(":")[1], "contextId": context}),
            (f"/a2a/{a_echo}", "tasks/cancel", {"id": task["id"]}),
            # The streaming methods refuse before any stream opens.
            (f"/a2a/{b_echo}", "message/stream", {"message": message("b was here", contextId=context)}),
            (f"/a2a/{a_echo}", "message/stream", {"message": message("b was here", contextId=context)}),
            (f"/a2a/{b_echo}", "tasks/resubscribe", {"id": task["id"]}),
            (f"/a2a/{a_echo}", "SubscribeToTask", {"id": task["id"]}),
            (f"/a2a/{world.assistant_id}", "message/send", {"message": {**message("x"), "parts": [
                {"kind": "data", "data": {"message": "x"}}]}})):
        answer = await rpc(b, path, method, params)
        assert "result" not in answer and "not found" in answer["error"]["message"].lower(), (path, method, answer)
        assert SECRET not in json.dumps(answer), (method, answer)
    assert len(await run_ids_of(a, context)) == 1
    for path in (f"/a2a/{a_echo}", f"/a2a/{b_echo}"):
        for params in ({}, {"contextId": context}):
            listed = await rpc(b, path, "ListTasks", params)
            assert "error" in listed or listed["result"].get("tasks", []) == [], (path, params, listed)
    # A reaches its own task and context.
    assert (await rpc(a, f"/a2a/{a_echo}", "tasks/get", {"id": task["id"]}))["result"]["id"] == task["id"]
    assert [t["id"] for t in (await rpc(a, f"/a2a/{a_echo}", "ListTasks", {}))["result"]["tasks"]] == [task["id"]]
    again = await rpc(a, f"/a2a/{a_echo}/", "message/send", {"message": message("again", contextId=context)})
    assert again["result"]["contextId"] == context, again
    assert len(await run_ids_of(a, context)) == 2


# --- MCP -----------------------------------------------------------------------------------------------------------


async def mcp(user: User, method: str, params: dict[str, Any], path: str = "/mcp") -> dict[str, Any]:
    response = await user.request("POST", path, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                                  headers=MCP_ACCEPT)
    assert response.status_code == 200, (method, response.status_code, response.text)
    return response.json()


async def test_mcp_tools_are_the_callers_own_assistants(a: User, b: User, world: World) -> None:
    for path in ("/mcp", "/mcp/"):
        b_tools = [t["name"] for t in (await mcp(b, "tools/list", {}, path))["result"]["tools"]]
        assert "a-private" not in b_tools, (path, b_tools)
        a_tools = [t["name"] for t in (await mcp(a, "tools/list", {}, path))["result"]["tools"]]
        assert "a-private" in a_tools, (path, a_tools)
        refused = await mcp(b, "tools/call", {"name": "a-private", "arguments": {}}, path)
        assert "error" in refused or refused["result"].get("isError") is True, refused
        assert SECRET not in json.dumps(refused)
    called = await mcp(a, "tools/call", {"name": "a-private", "arguments": {"message": "hi"}})
    assert called["result"]["structuredContent"]["seen"]["user_id"] == a.name, called
    assert world.assistant_id  # the tool is A's assistant of the world


async def test_mcp_applies_the_rest_routes_owner_filters(a: User, b: User, world: World) -> None:
    """MCP reaches assistants, runs and threads through the same core, so the same filters: each user's tools
    are exactly the assistants `POST /assistants/search` gives that user (as on LangGraph's server, which lists
    them through that search with the caller's credentials), and a run `tools/call` starts is the caller's. So a
    graph's own assistant, which has no owner, is nobody's tool under an owner filter, though REST runs it by
    its graph id: the same on LangGraph's server (docs/security.md, MCP under authorization)."""
    await b.ok("POST", "/assistants", {"graph_id": "caller", "name": "b caller"})
    for user in (a, b):
        searched = {tool_name(x["name"]) for x in await user.ok("POST", "/assistants/search", {"limit": 100})}
        listed = {t["name"] for t in (await mcp(user, "tools/list", {}))["result"]["tools"]}
        assert listed == searched, (user.name, listed, searched)
    assert {t["name"] for t in (await mcp(b, "tools/list", {}))["result"]["tools"]} == {"b_caller"}
    # A graph id: REST runs its assistant, MCP has no such tool.
    assert (await b.ok("POST", "/runs/wait", {"assistant_id": "whoami", "input": {}}))["seen"]["user_id"] == b.name
    unknown = await mcp(b, "tools/call", {"name": "whoami", "arguments": {}})
    assert unknown["error"] == {"code": -32602, "message": "Unknown tool: whoami"}, unknown
    # B's tool runs as B: its graph's own client sees B's threads only, and A's thread is not found.
    called = await mcp(b, "tools/call", {"name": "b_caller", "arguments": {"other_thread": world.thread_id}})
    seen = called["result"]["structuredContent"]["seen"]
    assert seen == {"owners": [b.name], "made_owner": b.name, "nested_user": b.name, "other_thread": "NotFoundError",
                    "posing_owners": [b.name]}, called
    assert SECRET not in json.dumps(called)
    assert await a.ok("POST", "/threads/search", {"metadata": {"made_by": "caller"}}) == []
    assert len(await b.ok("POST", "/threads/search", {"metadata": {"made_by": "caller"}})) == 1
    # A cannot call B's tool.
    assert (await mcp(a, "tools/call", {"name": "b_caller", "arguments": {}}))["error"]["code"] == -32602


# --- Protocol v2 ------------------------------------------------------------------------------------------------------


async def websocket(user: User, path: str, command: dict[str, Any]) -> list[dict[str, Any]]:
    """What the app sends on a WebSocket on which `command` is sent once accepted; the client leaves at the first
    answer (a JSON text, a close, or a refused handshake)."""
    sent: list[dict[str, Any]] = []
    answered, leave = asyncio.Event(), asyncio.Event()
    inbox = [{"type": "websocket.receive", "text": json.dumps(command)}, {"type": "websocket.connect"}]

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop()
        await leave.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] in ("websocket.send", "websocket.close", "websocket.http.response.body"):
            answered.set()

    scope = {"type": "websocket", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"host", b"threadline"), (b"authorization", f"Bearer user-{user.name}".encode())],
             "scheme": "ws", "server": ("threadline", 80), "client": ("127.0.0.1", 1), "subprotocols": [],
             "asgi": {"version": "3.0"}, "extensions": {"websocket.http.response": {}}}
    await _run_until(user.app(scope, receive, send), answered, leave)
    return sent


def texts(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["text"]) for m in sent if m["type"] == "websocket.send" and m.get("text")]


async def command(user: User, thread_id: str, method: str, params: dict[str, Any]) -> tuple[int, Any]:
    response = await user.request("POST", f"/threads/{thread_id}/commands", {"id": 1, "method": method,
                                                                              "params": params})
    return response.status_code, response.json()


async def test_protocol_commands_and_events_are_the_callers_own(a: User, b: User, world: World) -> None:
    thread_id = str(uuid.uuid4())
    status, started = await command(a, thread_id, "run.start", {"assistant_id": "whoami", "input": {"message": SECRET}})
    assert status == 200 and started["type"] == "success", started
    await a.ok("GET", f"/threads/{thread_id}/runs/{started['result']['run_id']}/join")
    assert (await a.ok("GET", f"/threads/{thread_id}"))["metadata"]["owner"] == a.name
    # Commands: a 404, or the protocol's error envelope; never a run on A's thread, nor A's tree.
    for tid in (thread_id, world.thread_id):
        for method, params in (("run.start", {"assistant_id": "whoami", "input": {"message": "b was here"}}),
                               ("agent.getTree", {})):
            status, answer = await command(b, tid, method, params)
            assert status == 404 or (status == 200 and answer["type"] == "error"), (method, status, answer)
            assert SECRET not in json.dumps(answer)
    assert len(await run_ids_of(a, thread_id)) == 1 and await run_ids_of(a, world.thread_id) == [world.run_id]
    # The SSE stream of A's thread's events.
    events = {"channels": ["lifecycle", "values"]}
    refused = await b.ask("POST", f"/threads/{thread_id}/stream/events", events)
    assert refused.status == 404 and SECRET not in refused.text, (refused.status, refused.text)
    mine = await a.ask("POST", f"/threads/{thread_id}/stream/events", events, until=lambda body: b"data:" in body)
    assert mine.status == 200 and b"data:" in mine.body, (mine.status, mine.text)
    # The WebSocket: refused at the handshake, or closed, or an error; never a subscription, never an event.
    subscribe = {"id": 1, "method": "subscription.subscribe", "params": events}
    sent = await websocket(b, f"/threads/{thread_id}/stream/events", subscribe)
    frames = texts(sent)
    assert not any(f.get("type") in ("success", "event") for f in frames), frames
    refused_at_handshake = sent and sent[0]["type"] == "websocket.http.response.start" and sent[0]["status"] == 404
    closed = any(m["type"] == "websocket.close" for m in sent)
    assert refused_at_handshake or closed or any(f.get("type") == "error" for f in frames), sent
    assert SECRET not in json.dumps([m.get("text") or m.get("body", b"").decode() for m in sent])
    frames = texts(await websocket(a, f"/threads/{thread_id}/stream/events", subscribe))
    assert frames and frames[0]["type"] == "success" and frames[0]["result"]["subscription_id"], frames


# --- the console ------------------------------------------------------------------------------------------------------


async def test_the_console_shows_the_callers_own(a: User, b: User, world: World) -> None:
    t, r, x = world.thread_id, world.run_id, world.assistant_id
    for path in (f"/console/threads/{t}", f"/console/threads/{t}/runs/{r}", f"/console/runs/{r}",
                 f"/console/assistants/{x}"):
        page = await b.request("GET", path)
        assert page.status_code == 404 and SECRET not in page.text, (path, page.status_code)
        assert (await a.request("GET", path)).status_code == 200, path
    for path, shown in (("/console/threads", t), ("/console/assistants", x),
                        ("/console/queue", world.pending_run_ids[0]), ("/console/store", SECRET)):
        page = await b.request("GET", path)
        assert page.status_code == 200 and shown not in page.text and SECRET not in page.text, path
        assert shown in (await a.request("GET", path)).text, path


# --- every route is covered ------------------------------------------------------------------------------------------


#: Each route holding someone's things -> the test that checks another user cannot reach them (and the owner can).
COVERED: dict[tuple[str, str], str] = {
    **{("POST", "/threads"): "test_what_b_creates_is_bs"},
    **dict.fromkeys([("GET", "/threads/{thread_id}"), ("PATCH", "/threads/{thread_id}"),
                     ("DELETE", "/threads/{thread_id}"), ("POST", "/threads/{thread_id}/copy"),
                     ("GET", "/threads/{thread_id}/state"), ("POST", "/threads/{thread_id}/state"),
                     ("GET", "/threads/{thread_id}/state/{checkpoint_id}"),
                     ("POST", "/threads/{thread_id}/state/checkpoint"), ("GET", "/threads/{thread_id}/history"),
                     ("POST", "/threads/{thread_id}/history"), ("GET", "/threads/{thread_id}/stream")],
                    "test_another_users_thread_is_not_found"),
    **dict.fromkeys([("POST", "/threads/search"), ("POST", "/threads/count"), ("POST", "/threads/prune")],
                    "test_thread_searches_counts_and_prunes_are_the_callers_own"),
    **dict.fromkeys([("GET", "/threads/{thread_id}/runs"), ("GET", "/threads/{thread_id}/runs/{run_id}"),
                     ("DELETE", "/threads/{thread_id}/runs/{run_id}"),
                     ("GET", "/threads/{thread_id}/runs/{run_id}/join"),
                     ("GET", "/threads/{thread_id}/runs/{run_id}/wait"),
                     ("GET", "/threads/{thread_id}/runs/{run_id}/stream"),
                     ("POST", "/threads/{thread_id}/runs/{run_id}/cancel"), ("GET", "/runs/{run_id}"),
                     ("DELETE", "/runs/{run_id}"), ("GET", "/runs/{run_id}/wait"), ("GET", "/runs/{run_id}/stream"),
                     ("POST", "/runs/{run_id}/cancel")],
                    "test_another_users_runs_are_not_found"),
    **dict.fromkeys([("POST", "/threads/{thread_id}/runs"), ("POST", "/threads/{thread_id}/runs/wait"),
                     ("POST", "/threads/{thread_id}/runs/stream"), ("POST", "/runs"), ("POST", "/runs/wait"),
                     ("POST", "/runs/stream"), ("POST", "/runs/batch")],
                    "test_runs_cannot_be_started_on_another_users_thread"),
    **dict.fromkeys([("POST", "/runs/search"), ("POST", "/runs/cancel")],
                    "test_run_searches_and_cancels_leave_another_users_runs_alone"),
    **dict.fromkeys([("GET", "/assistants/{assistant_id}"), ("PATCH", "/assistants/{assistant_id}"),
                     ("DELETE", "/assistants/{assistant_id}"), ("GET", "/assistants/{assistant_id}/schemas"),
                     ("GET", "/assistants/{assistant_id}/graph"), ("GET", "/assistants/{assistant_id}/subgraphs"),
                     ("GET", "/assistants/{assistant_id}/subgraphs/{namespace}"),
                     ("POST", "/assistants/{assistant_id}/versions"), ("POST", "/assistants/{assistant_id}/latest"),
                     ("GET", "/agents/{agent_id}"), ("GET", "/agents/{agent_id}/schemas"),
                     ("GET", "/a2a/{assistant_id}"), ("GET", "/a2a/{assistant_id}/"),
                     ("GET", "/a2a/{assistant_id}/.well-known/agent-card.json"),
                     ("GET", "/a2a/{assistant_id}/.well-known/agent.json"), ("GET", "/.well-known/agent-card.json")],
                    "test_another_users_assistant_is_not_found"),
    ("POST", "/assistants"): "test_another_users_assistant_cannot_be_run_or_taken",
    **dict.fromkeys([("POST", "/assistants/search"), ("POST", "/assistants/count"), ("POST", "/agents/search")],
                    "test_assistant_and_agent_searches_are_the_callers_own"),
    **dict.fromkeys([("GET", "/runs/crons/{cron_id}"), ("PATCH", "/runs/crons/{cron_id}"),
                     ("DELETE", "/runs/crons/{cron_id}"), ("POST", "/threads/{thread_id}/runs/crons")],
                    "test_another_users_crons_are_not_found"),
    **dict.fromkeys([("POST", "/runs/crons"), ("POST", "/runs/crons/search"), ("POST", "/runs/crons/count")],
                    "test_cron_searches_and_counts_are_the_callers_own"),
    **dict.fromkeys([("PUT", "/store/items"), ("GET", "/store/items"), ("DELETE", "/store/items"),
                     ("POST", "/store/items/search"), ("POST", "/store/namespaces")],
                    "test_store_items_are_the_callers_own"),
    **dict.fromkeys([("POST", "/a2a/{assistant_id}"), ("POST", "/a2a/{assistant_id}/")],
                    "test_a2a_tasks_and_contexts_are_the_callers_own"),
    ("POST", "/mcp"): "test_mcp_applies_the_rest_routes_owner_filters",
    ("POST", "/mcp/"): "test_mcp_tools_are_the_callers_own_assistants",
    **dict.fromkeys([("POST", "/threads/{thread_id}/commands"), ("POST", "/threads/{thread_id}/stream/events"),
                     ("WEBSOCKET", "/threads/{thread_id}/stream/events")],
                    "test_protocol_commands_and_events_are_the_callers_own"),
    **dict.fromkeys([("GET", "/console/threads"), ("GET", "/console/threads/{thread_id}"),
                     ("GET", "/console/threads/{thread_id}/runs/{run_id}"), ("GET", "/console/runs/{run_id}"),
                     ("GET", "/console/assistants"), ("GET", "/console/assistants/{assistant_id}"),
                     ("GET", "/console/store"), ("GET", "/console/queue")],
                    "test_the_console_shows_the_callers_own"),
}

#: Routes that hold nothing of any user's, with why.
NO_USER_RESOURCE: dict[tuple[str, str], str] = {
    ("GET", "/"): "a health answer ({ok: true}) for load balancers",
    ("GET", "/ok"): "liveness/readiness",
    ("GET", "/info"): "the server's version, graphs and queue totals: counts, no ids or contents",
    ("GET", "/metrics"): "aggregate counters, no ids or contents",
    ("GET", "/openapi.json"): "the API's schema, the same for everyone",
    ("GET", "/docs"): "the API reference page",
    ("GET", "/docs/oauth2-redirect"): "the API reference's sign-in redirect",
    ("GET", "/redoc"): "the API reference page",
    ("GET", "/docs/assets/x"): "the API reference's static files",
    ("DELETE", "/mcp"): "ends an MCP session, a no-op (none is kept)",
    ("DELETE", "/mcp/"): "ends an MCP session, a no-op (none is kept)",
    ("GET", "/console"): "a redirect to /console/threads",
    ("GET", "/console/login"): "the console's sign-in page",
    ("GET", "/console/static/x"): "the console's static files",
    ("POST", "/ui/{graph_id}"): "the tags that load a graph's generative UI bundle: the project's code, no one's data",
    ("GET", "/ui/{graph_id}/{asset}"): "a graph's generative UI bundle: the project's component code",
}


def _shape(path: str) -> str:
    return re.sub(r"\{[^{}]*\}", "{}", path)


def test_every_route_is_covered() -> None:
    routes = set(our_routes(create_app(Settings(config=str(PROJECT)))))
    assert len(routes) > 80 and ("WEBSOCKET", "/threads/{thread_id}/stream/events") in routes
    uncovered = sorted(routes - COVERED.keys() - NO_USER_RESOURCE.keys())
    assert not uncovered, ("routes no isolation test covers (add each to COVERED with its test, or to "
                           f"NO_USER_RESOURCE with why it holds nothing of anyone's): {uncovered}")
    assert not COVERED.keys() & NO_USER_RESOURCE.keys()
    stale = sorted((COVERED.keys() | NO_USER_RESOURCE.keys()) - routes)
    assert not stale, f"routes the app no longer serves: {stale}"
    # Each test named exists and really requests its route: the path (ids elided) is in its source or in that
    # of a helper of this module it calls.
    for (method, path), name in COVERED.items():
        assert name.startswith("test_") and inspect.isfunction(globals().get(name)), name
        assert re.search(re.escape(_shape(path)) + r"[\"'?]", _source_with_helpers(name)), \
            f"{name} never requests {method} {path}"


def _source_with_helpers(name: str) -> str:
    source = inspect.getsource(globals()[name])
    helpers = {n for n in re.findall(r"(\w+)\(", source) if inspect.isfunction(globals().get(n))
               and globals()[n].__module__ == __name__ and n != name}
    return _shape("\n".join([source, *(inspect.getsource(globals()[n]) for n in sorted(helpers))]))
