"""Screenshots of each console page for docs/ui/, taken as the browser tests see the pages.

    .venv/bin/python -m tests.ui.screenshots        # writes docs/ui/*.png
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx

from tests.processes import ROOT
from tests.ui.harness import chromium, serve_example

OUT = ROOT / "docs" / "ui"


def seed(api: httpx.Client) -> dict[str, str]:
    """A little of everything: a chat with a tool call, a thread waiting for approval, a counter's history,
    a failed run (`int("many")`), store items."""
    chat = api.post("/threads", json={"metadata": {"user": "ada", "topic": "words"}}).json()["thread_id"]
    for text in ("How many words is this question?", "And this one, which is a little longer?"):
        api.post(f"/threads/{chat}/runs/wait", json={
            "assistant_id": "assistant", "input": {"messages": [{"role": "user", "content": text}]}})
    waiting = api.post("/threads", json={"metadata": {"user": "grace"}}).json()["thread_id"]
    api.post(f"/threads/{waiting}/runs/wait", json={"assistant_id": "approval", "input": {"request": "deploy v2"}})
    for i in range(3):
        counter = api.post("/threads", json={"metadata": {"user": "linus", "batch": i}}).json()["thread_id"]
        api.post(f"/threads/{counter}/runs/wait", json={"assistant_id": "counter", "input": {"tag": f"run {i}"}})
    broken = api.post("/threads", json={"metadata": {"user": "linus"}}).json()["thread_id"]
    api.post(f"/threads/{broken}/runs/wait", json={"assistant_id": "counter", "input": {"increment": "many"}})
    for ns, key, value in ((["users", "ada"], "preferences", {"theme": "dark", "language": "en"}),
                           (["users", "ada"], "memory", {"text": "prefers short answers"}),
                           (["users", "grace"], "preferences", {"theme": "light"}),
                           (["docs"], "welcome", {"text": "hello and welcome"})):
        api.put("/store/items", json={"namespace": ns, "key": key, "value": value})
    return {"chat": chat, "waiting": waiting}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder, serve_example(Path(folder)) as url, chromium() as browser:
        with httpx.Client(base_url=url, timeout=60) as api:
            ids = seed(api)
            assistant = api.post("/assistants/search", json={"graph_id": "assistant"}).json()[0]["assistant_id"]
        page = browser.new_page(viewport={"width": 1280, "height": 800}, base_url=url)

        def shot(name: str, path: str, full: bool = False) -> None:
            page.goto(path)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(OUT / f"{name}.png"), full_page=full)
            print("wrote", OUT / f"{name}.png")

        shot("threads", "/console/threads")
        shot("thread", f"/console/threads/{ids['chat']}", full=True)
        shot("interrupt", f"/console/threads/{ids['waiting']}")
        shot("assistants", "/console/assistants")
        shot("assistant", f"/console/assistants/{assistant}", full=True)
        shot("store", "/console/store?ns=users&ns=ada")
        shot("queue", "/console/queue")
        # The live run view, mid-stream: a long message is echoed back a word at a time.
        page.goto(f"/console/threads/{ids['chat']}")
        form = page.locator("[data-run-form]")
        form.get_by_label("Assistant").select_option(label="assistant (assistant)")
        words = " ".join(["a long message, echoed back one word at a time while the run streams;"] * 8)
        form.get_by_label("Input (JSON)").fill(f'{{"messages": [{{"role": "user", "content": "{words}"}}]}}')
        form.get_by_role("button", name="Start run").click()
        page.wait_for_url("**/runs/**")
        page.locator("#live-messages .msg-ai .text").last.filter(
            has_text="echoed back one word at a time while the run streams; a long").wait_for()
        page.screenshot(path=str(OUT / "run.png"))
        print("wrote", OUT / "run.png")
        page.get_by_role("button", name="Cancel run").click()
        page.locator("#run-status").filter(has_text="interrupted").wait_for()


if __name__ == "__main__":
    main()
