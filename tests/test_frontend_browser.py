"""`useStream` in a real browser against a real `threadline serve`: a minimal chat page built on
`@langchain/langgraph-sdk/react` (tests/frontend/src, built by tests/environments.py), served from another origin as
a front-end is, and driven by Playwright with Debian's chromium. The agent (tests/frontend/project) calls a tool on a
scripted model, interrupts for approval, streams slowly enough to be stopped, and pushes a generative UI card.

Whatever the page's requests get that LangGraph's server would not answer so shows as a failed request, an error
the hook reports (`onError`) or a JavaScript error: each fails the test that caused it."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.environments import frontend_build, frontend_missing
from tests.processes import serving
from tests.ui.harness import browser_missing, chromium

pytestmark = pytest.mark.slow
WHY = browser_missing() or frontend_missing()
if WHY:
    if os.environ.get("CI") == "true":  # CI builds the page and installs chromium (scripts/test)
        raise RuntimeError(f"the useStream browser tests cannot run: {WHY}")
    pytest.skip(WHY, allow_module_level=True)

from playwright.sync_api import Page, expect  # noqa: E402

PROJECT = Path(__file__).parent / "frontend" / "project"
BUNDLER = frontend_build() / "node_modules" / ".bin" / "langgraphjs-ui"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`threadline serve` on the project, on the embedded default or on PostgreSQL + Redis."""
    folder = tmp_path_factory.mktemp("frontend")
    shutil.copytree(PROJECT, folder / "project", ignore=shutil.ignore_patterns("__pycache__", ".threadline"))
    backend = [] if request.param == "sqlite" else [
        arg for name, value in request.getfixturevalue("scaleout_services").fresh().settings().items()
        for arg in (f"--{name.replace('_', '-')}", value)]
    with serving(folder / "project", "--ui-bundler", str(BUNDLER), *backend) as (url, _):
        yield url


@pytest.fixture(scope="module")
def page_origin() -> Iterator[str]:
    """The built page, served by a plain static server on its own port: another origin than the API's."""
    handler = functools.partial(_Quiet, directory=str(frontend_build() / "dist"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def api(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as client:
        yield client


@pytest.fixture
def page(browser: Any, server: str, page_origin: str) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    pg = context.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda exc: problems.append(f"JavaScript error: {exc}"))
    pg.on("console", lambda msg: problems.append(f"console: {msg.text}") if msg.type == "error" else None)
    pg.on("requestfailed", lambda r: problems.append(f"{r.method} {r.url}: {r.failure}")
          if r.failure != "net::ERR_ABORTED" else None)  # an aborted stream is how stop() ends its request
    pg.on("response", lambda r: problems.append(f"{r.request.method} {r.url}: {r.status}") if r.status >= 400 else None)
    pg.set_default_timeout(30_000)
    pg.goto(f"{page_origin}/index.html?api={server}")
    yield pg
    context.close()
    assert not problems, problems


def send(page: Page, text: str) -> None:
    page.get_by_role("textbox", name="Message").fill(text)
    page.get_by_role("button", name="Send").click()


def messages(page: Page) -> Any:
    return page.get_by_role("list", name="Messages").locator("> li")


def thread_of(page: Page) -> str:
    expect(page.get_by_test_id("thread-id")).not_to_have_text("new")
    return page.get_by_test_id("thread-id").inner_text()


def settled(page: Page, api: httpx.Client) -> str:
    """The page's thread, once its latest run has ended on the server (the page may show the answer first)."""
    expect(page.get_by_test_id("status")).to_have_text("idle")
    thread = thread_of(page)
    latest = api.get(f"/threads/{thread}/runs").json()[0]
    assert api.get(f"/threads/{thread}/runs/{latest['run_id']}/join").status_code == 200
    return thread


def test_a_chat_with_tool_calls_and_a_generative_ui_card(page: Page, api: httpx.Client) -> None:
    send(page, "weather in Paris")
    expect(page.get_by_test_id("tool-call")).to_have_text('tool call: weather {"city":"Paris"}')
    expect(page.get_by_test_id("tool-result")).to_contain_text('"forecast": "sunny"')
    answer = messages(page).filter(has_text="It is sunny in Paris, 21 degrees.")
    expect(answer).to_have_count(1)
    # The card: LoadExternalComponent posted to /ui/agent, loaded the bundle from the server and rendered the
    # component into a shadow root beside the message its `message_id` names.
    expect(answer.get_by_test_id("weather-card")).to_have_text("Weather card: Paris, sunny, 21 °C")
    state = api.get(f"/threads/{settled(page, api)}/state").json()
    assert [m["type"] for m in state["values"]["messages"]] == ["human", "ai", "tool", "ai"]
    assert [u["name"] for u in state["values"]["ui"]] == ["weather"]


def test_the_history_lists_threads_and_reopens_one(page: Page, api: httpx.Client) -> None:
    send(page, "hello from the history test")
    expect(messages(page).filter(has_text="You said: hello from the history test")).to_have_count(1)
    expect(page.get_by_test_id("status")).to_have_text("idle")
    first = thread_of(page)
    page.get_by_role("button", name="New thread").click()
    expect(messages(page)).to_have_count(0)
    send(page, "weather in Oslo")  # a second thread, with a card
    expect(page.get_by_test_id("weather-card")).to_have_text("Weather card: Oslo, sunny, 21 °C")
    second = thread_of(page)
    assert second != first

    page.reload()  # the page keeps the thread in its URL: useStream loads its history and the card again
    expect(messages(page).filter(has_text="It is sunny in Oslo, 21 degrees.")).to_have_count(1)
    expect(page.get_by_test_id("weather-card")).to_have_text("Weather card: Oslo, sunny, 21 °C")
    history = page.get_by_role("navigation", name="History")
    expect(history.locator(f'button[data-thread="{second}"]')).to_be_visible()
    history.locator(f'button[data-thread="{first}"]').click()
    expect(messages(page).filter(has_text="You said: hello from the history test")).to_have_count(1)
    expect(page.get_by_test_id("weather-card")).to_have_count(0)
    send(page, "and a second message")  # continuing the reopened thread
    expect(messages(page).filter(has_text="You said: and a second message")).to_have_count(1)
    assert settled(page, api) == first
    assert len(api.get(f"/threads/{first}/state").json()["values"]["messages"]) == 4


def test_an_interrupt_is_approved_as_agent_chat_ui_approves_it(page: Page, api: httpx.Client) -> None:
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r.post_data_json)
            if r.method == "POST" and r.url.endswith("/runs/stream") else None)
    send(page, "approve the deploy")
    expect(page.get_by_test_id("interrupt")).to_have_text("Approve the deploy?")
    expect(page.get_by_test_id("status")).to_have_text("idle")
    page.get_by_role("button", name="Approve").click()
    expect(messages(page).filter(has_text="the deploy: approved")).to_have_count(1)
    expect(page.get_by_test_id("interrupt")).to_have_count(0)
    resume = sent[-1]
    assert resume["command"] == {"resume": {"approved": True}} and resume["input"] == {}, resume  # both, as it sends
    thread = api.get(f"/threads/{settled(page, api)}").json()
    assert thread["status"] == "idle" and not thread["interrupts"], thread


def test_stop_cancels_the_run_on_the_server(page: Page, api: httpx.Client) -> None:
    send(page, "count to 2000")  # 2,000 words, 20 ms apart: 40 s unless stopped
    expect(messages(page).filter(has_text="1 2 3 4 5")).to_have_count(1)
    thread = thread_of(page)
    page.get_by_role("button", name="Stop").click()
    expect(page.get_by_test_id("status")).to_have_text("idle")
    run = api.get(f"/threads/{thread}/runs").json()[0]
    joined = api.get(f"/threads/{thread}/runs/{run['run_id']}/join", timeout=30)  # ends once the run has stopped
    assert joined.status_code == 200
    assert api.get(f"/threads/{thread}/runs/{run['run_id']}").json()["status"] == "interrupted"
    # The answer was cut short: the model's step never finished, so the thread holds the question alone, and
    # the page, which reads the thread's state back once stopped, shows no answer.
    assert [m["type"] for m in api.get(f"/threads/{thread}/state").json()["values"]["messages"]] == ["human"]
    expect(messages(page)).to_have_count(1)
    send(page, "still here?")  # the thread takes the next message at once
    expect(messages(page).filter(has_text="You said: still here?")).to_have_count(1)
