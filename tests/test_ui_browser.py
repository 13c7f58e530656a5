"""The web console in a real browser: Debian's chromium driven by Playwright against a real `threadline serve`
with the bundled example agents. Each test makes the data it looks at through the HTTP API, then uses the
console as a person would: reading pages, filling forms, pressing buttons."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.ui.harness import browser_missing, chromium, serve_example

pytestmark = pytest.mark.e2e  # chromium
WHY = browser_missing()
if WHY:
    if os.environ.get("CI") == "true":  # CI installs chromium (scripts/test): its absence is a failure there
        raise RuntimeError(f"the console's browser tests cannot run: {WHY}")
    pytest.skip(WHY, allow_module_level=True)

from playwright.sync_api import Page, expect  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_example(tmp_path_factory.mktemp("console")) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1366, "height": 860}, base_url=server)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    # What the console's Content-Security-Policy blocks is reported on the browser's console, not raised.
    pg.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    pg.set_default_timeout(30_000)
    yield pg
    context.close()
    assert not errors, f"JavaScript errors (or blocked by the CSP) on the page: {errors}"


@pytest.fixture
def api(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=60) as client:
        yield client


def assistant_id(api: httpx.Client, graph_id: str) -> str:
    found = api.post("/assistants/search", json={"graph_id": graph_id}).json()
    return str(found[0]["assistant_id"])


def chat_thread(api: httpx.Client, text: str, **metadata: Any) -> str:
    thread = api.post("/threads", json={"metadata": metadata}).json()["thread_id"]
    done = api.post(f"/threads/{thread}/runs/wait", json={
        "assistant_id": "assistant", "input": {"messages": [{"role": "user", "content": text}]}})
    assert done.status_code == 200, done.text
    return str(thread)


def test_each_page_opens_and_shows_its_data(page: Page, api: httpx.Client) -> None:
    thread = chat_thread(api, "hello there", user="ada")
    api.put("/store/items", json={"namespace": ["users", "ada"], "key": "prefs", "value": {"theme": "dark"}})

    page.goto("/console")
    expect(page.get_by_role("heading", name="Threads", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name=thread)).to_be_visible()
    page.get_by_label("Metadata (JSON)").fill('{"user": "ada"}')
    page.get_by_role("button", name="Search").click()
    expect(page.locator("tbody tr")).to_have_count(1)
    page.get_by_label("Metadata (JSON)").fill('{"user": "nobody"}')
    page.get_by_role("button", name="Search").click()
    expect(page.get_by_text("No threads match.")).to_be_visible()

    page.get_by_role("link", name="Assistants").click()
    expect(page.get_by_role("link", name="assistant", exact=True)).to_be_visible()
    page.get_by_role("link", name="assistant", exact=True).click()
    expect(page.get_by_role("heading", name="Graph", exact=True)).to_be_visible()
    for node in ("__start__", "model", "tools", "__end__"):
        expect(page.locator(f'svg.graph [data-node="{node}"]')).to_have_count(1)
    expect(page.locator("svg.graph path.edge.conditional")).not_to_have_count(0)
    page.get_by_text("Input schema", exact=True).click()
    expect(page.locator("details[open] pre")).to_contain_text("messages")

    page.goto(f"/console/threads/{thread}")
    chat = page.locator("ol.chat")
    expect(chat.locator(".msg-human")).to_contain_text("hello there")
    expect(chat.locator(".msg-ai .tool-call")).to_contain_text("word_count")
    expect(chat.locator(".msg-tool")).to_contain_text("2 words")
    expect(chat.locator(".msg-ai").last).to_contain_text("Your message has 2 words")

    page.get_by_role("link", name="Store").click()
    page.get_by_role("link", name="users").click()
    expect(page.get_by_role("heading", name="Items in users")).to_be_visible()
    expect(page.locator("[data-item]")).to_contain_text("prefs")

    page.get_by_role("link", name="Queue").click()
    expect(page.get_by_text("Worker saturation")).to_be_visible()
    expect(page.locator("#fig-pending")).to_have_text("0")

    page.goto("/console/login")
    page.get_by_label("API key or token").fill("sk-test")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("status")).to_have_text("Signed in for this tab.")
    assert page.evaluate("sessionStorage.getItem('threadline.apiKey')") == "sk-test"


def test_a_chat_turn_streams_its_tokens_into_the_page(page: Page, api: httpx.Client) -> None:
    page.goto(f"/console/assistants/{assistant_id(api, 'assistant')}")
    form = page.locator("[data-run-form]")
    form.get_by_label("Input (JSON)").fill('{"mesages": []}')  # a typo the input schema catches
    form.get_by_role("button", name="Start run").click()
    expect(form.get_by_role("alert")).to_contain_text('"mesages" is not in the input schema')
    text = "please count the words in this sentence for me"
    form.get_by_label("Input (JSON)").fill(f'{{"messages": [{{"role": "user", "content": "{text}"}}]}}')
    form.get_by_role("button", name="Start run").click()
    page.wait_for_url("**/runs/**")
    # Record every length the AI's reply has while it streams: tokens are appended one by one.
    page.evaluate("""() => { window.seen = new Set(); new MutationObserver(() => {
        const all = document.querySelectorAll('#live-messages .msg-ai .text');
        if (all.length) window.seen.add(all[all.length - 1].textContent.length);
      }).observe(document.getElementById('live-messages'), {subtree: true, childList: true, characterData: true}); }""")
    reply = page.locator("#live-messages .msg-ai .text").last
    expect(reply).to_have_text(f"Your message has 9 words. You said: {text}")
    expect(page.locator("#run-status")).to_have_text("success")
    assert page.evaluate("window.seen.size") > 5, "the reply arrived in one piece, not as tokens"
    expect(page.locator("#live-messages .tool-call")).to_contain_text("word_count")
    expect(page.locator("#events")).to_contain_text("updates")
    expect(page.get_by_role("button", name="Cancel run")).to_be_disabled()

    # A reload shows the same events again, and resumes after the last one (nothing twice).
    count = page.locator("#events li").count()
    page.reload()
    expect(page.locator("#stream-state")).to_contain_text("stream ended")
    expect(page.locator("#events li")).to_have_count(count)
    expect(page.locator("#live-messages .msg-ai .text").last).to_have_text(
        f"Your message has 9 words. You said: {text}")

    page.get_by_role("link", name=page.locator("h1 + p a").nth(1).inner_text()).click()  # the thread
    expect(page.locator("ol.chat .msg-human")).to_contain_text(text)


def test_an_interrupt_is_resumed_from_its_form(page: Page, api: httpx.Client) -> None:
    thread = api.post("/threads", json={}).json()["thread_id"]
    api.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "approval", "input": {"request": "deploy"}})
    page.goto(f"/console/threads/{thread}")
    waiting = page.get_by_role("region", name="Waiting for you")
    expect(waiting).to_contain_text("Approve 'deploy'?")
    waiting.get_by_label("Resume with (JSON)").fill("tru")
    waiting.get_by_role("button", name="Resume").click()
    expect(waiting.get_by_role("alert")).to_contain_text("not valid JSON")
    waiting.get_by_label("Resume with (JSON)").fill("true")
    waiting.get_by_role("button", name="Resume").click()
    page.wait_for_url("**/runs/**")
    expect(page.locator("#run-status")).to_have_text("success")
    page.goto(f"/console/threads/{thread}")
    expect(page.get_by_role("region", name="Waiting for you")).to_have_count(0)
    expect(page.get_by_role("region", name="State values")).to_contain_text("done: deploy")


def test_a_running_run_is_cancelled_from_its_page(page: Page, api: httpx.Client) -> None:
    thread = api.post("/threads", json={}).json()["thread_id"]
    page.goto(f"/console/threads/{thread}")
    form = page.locator("[data-run-form]")
    form.get_by_label("Assistant").select_option(label="assistant (assistant)")
    words = " ".join(["word"] * 400)  # echoed back at a word per 50 ms: 20 s of streaming
    form.get_by_label("Input (JSON)").fill(f'{{"messages": [{{"role": "user", "content": "{words}"}}]}}')
    form.get_by_role("button", name="Start run").click()
    page.wait_for_url("**/runs/**")
    expect(page.locator("#live-messages .msg-ai .text").last).to_contain_text("Your message has")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-status")).to_have_text("interrupted")
    expect(page.locator("#stream-state")).to_contain_text("stream ended")
    assert len(page.locator("#live-messages .msg-ai .text").last.inner_text().split()) < 400
    run_id = page.url.rsplit("/", 1)[-1]
    assert api.get(f"/threads/{thread}/runs/{run_id}").json()["status"] == "interrupted"


def test_history_shows_the_state_at_an_older_checkpoint(page: Page, api: httpx.Client) -> None:
    thread = api.post("/threads", json={}).json()["thread_id"]
    for tag in ("first", "second"):
        api.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "counter", "input": {"tag": tag}})
    page.goto(f"/console/threads/{thread}")
    state = page.get_by_role("region", name="State values")
    expect(state).to_contain_text("second")
    history = page.get_by_role("region", name="History")
    steps = history.get_by_role("link")
    assert steps.count() >= 4
    steps.last.click()  # the oldest checkpoint: the thread before any run wrote to it
    expect(page.get_by_role("status")).to_contain_text("Showing the state at checkpoint")
    expect(page.get_by_role("region", name="State values")).not_to_contain_text("second")
    page.get_by_role("link", name="Back to the latest").click()
    expect(page.get_by_role("region", name="State values")).to_contain_text("second")


def test_the_store_is_browsed_searched_put_and_deleted(page: Page, api: httpx.Client) -> None:
    api.put("/store/items", json={"namespace": ["docs", "recipes"], "key": "soup", "value": {"text": "leek soup"}})
    page.goto("/console/store")
    form = page.locator("[data-put-form]")
    form.get_by_label("Namespace (parts separated by /)").fill("docs/recipes")
    form.get_by_label("Key").fill("bread")
    form.get_by_label("Value (a JSON object)").fill('{"text": "sourdough bread"}')
    form.get_by_role("button", name="Put").click()
    expect(page.get_by_role("heading", name="Items in docs/recipes")).to_be_visible()
    expect(page.locator("[data-item]")).to_have_count(2)
    tree = page.get_by_role("navigation", name="Namespaces")
    tree.get_by_role("link", name="(all)").click()
    tree.get_by_role("link", name="docs").click()
    tree.get_by_role("link", name="recipes").click()
    expect(page.locator("[data-item]")).to_have_count(2)
    page.get_by_label("Search in docs/recipes").fill("bread")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("[data-item]").first).to_contain_text("bread")
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto("/console/store?ns=docs&ns=recipes")
    page.get_by_role("button", name="Delete soup").click()
    expect(page.locator("[data-item]")).to_have_count(1)
    assert api.get("/store/items", params={"namespace": "docs.recipes", "key": "soup"}).json() is None


def test_a_stateless_run_streams_its_custom_events(page: Page, api: httpx.Client) -> None:
    page.goto(f"/console/assistants/{assistant_id(api, 'counter')}")
    form = page.locator("[data-run-form]")
    form.get_by_label("stateless (no thread kept)").check()
    form.get_by_label("Input (JSON)").fill('{"steps": 3, "tag": "hello", "increment": "2"}')
    form.get_by_role("button", name="Start run").click()
    expect(form.get_by_role("alert")).to_contain_text('"increment" must be integer, not string')
    form.get_by_label("Input (JSON)").fill('{"steps": 3, "tag": "hello", "increment": 2}')
    form.get_by_role("button", name="Start run").click()
    page.wait_for_url("**/console/runs/**")
    expect(page.locator("#run-status")).to_have_text("success")
    expect(page.locator("#events li").filter(has_text="custom")).to_have_count(3)
    expect(page.locator("#events")).to_contain_text('"tag":"hello"')


UNLABELLED = """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea, button')]
    .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.textContent.trim())
    .map((el) => el.outerHTML)"""


def test_every_control_is_labelled_and_the_keyboard_reaches_the_content(page: Page, api: httpx.Client) -> None:
    thread = chat_thread(api, "hi")
    waiting = api.post("/threads", json={}).json()["thread_id"]
    api.post(f"/threads/{waiting}/runs/wait", json={"assistant_id": "approval", "input": {"request": "x"}})
    api.put("/store/items", json={"namespace": ["a11y"], "key": "k", "value": {"v": 1}})
    for path in ("/console/threads", f"/console/threads/{thread}", f"/console/threads/{waiting}",
                 "/console/assistants", f"/console/assistants/{assistant_id(api, 'assistant')}", "/console/store",
                 "/console/queue", "/console/login"):
        page.goto(path)
        assert page.evaluate(UNLABELLED) == [], path
    page.goto("/console/threads")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_label("Status")).to_be_focused()
