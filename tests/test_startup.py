"""`threadline serve` and `threadline dev` as real processes, as a person starts them in a project folder: what
they print when they start, when they cannot, and how `dev` picks up a changed graph."""

from __future__ import annotations

import fcntl
import http.client
import importlib.util
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.processes import clean_env, serving, threadline_cmd

pytestmark = pytest.mark.e2e  # each test starts the `threadline` command

README = Path(__file__).parents[1] / "README.md"
GRAPH = '''
from typing import TypedDict

from langgraph.graph import START, StateGraph


class State(TypedDict):
    text: str


def reply(state: State) -> dict:
    return {{"text": "{word} " + state["text"]}}


graph = StateGraph(State).add_node("reply", reply).add_edge(START, "reply").compile()
'''


def _project(folder: Path, word: str = "hello") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "agent.py").write_text(GRAPH.format(word=word))
    (folder / "langgraph.json").write_text(json.dumps({"graphs": {"agent": "./agent.py:graph"}}))
    return folder


def _fails(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(threadline_cmd("serve", "--port", "0", *args), cwd=folder, env=clean_env(),
                          capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0, done
    assert "listening on" not in done.stdout  # the banner only once the server listens
    return done


def test_serve_prints_its_banner_once_listening_and_ignores_its_folder_in_git(tmp_path: Path) -> None:
    folder = _project(tmp_path / "proj")
    with serving(folder) as (url, _):
        assert httpx.get(f"{url}/ok").json() == {"ok": True}  # the banner's address answers
        run = httpx.post(f"{url}/runs/wait", json={"assistant_id": "agent", "input": {"text": "you"}}, timeout=30)
        assert run.json() == {"text": "hello you"}
    assert (folder / ".threadline" / ".gitignore").read_text().splitlines()[-1] == "*"
    log = (folder / "server.log").read_text()
    assert "worker started: 10 slots" in log and "run started" in log and "status=success" in log


def test_port_in_use_is_one_message_with_a_hint(tmp_path: Path) -> None:
    folder = _project(tmp_path / "proj")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(threadline_cmd("serve", "--port", str(port)), cwd=folder, env=clean_env(),
                              capture_output=True,
                              text=True, timeout=60)
    assert done.returncode != 0 and "listening on" not in done.stdout
    assert done.stderr.strip().splitlines() == [
        f"threadline: cannot listen on 127.0.0.1:{port}: Address already in use",
        "  hint: another server is listening there: stop it, or choose another port with --port",
    ]
    assert not (folder / ".threadline").exists()  # refused before the database is opened


def test_database_locked_by_another_process(tmp_path: Path) -> None:
    folder = _project(tmp_path / "proj")
    db = tmp_path / "busy.db"
    with open(tmp_path / "busy.db.lock", "wb") as held:  # as a live Threadline process holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = _fails(folder, "--database-url", f"sqlite:///{db}")
        debug = _fails(folder, "--database-url", f"sqlite:///{db}", "--log-level", "debug")
    [error] = [line for line in done.stderr.splitlines() if "cannot start" in line]
    assert f"another Threadline process is using {db}" in error
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 6, done.stderr
    assert "Traceback (most recent call last)" in debug.stderr  # at debug, where it was raised


def test_unknown_database_url_scheme(tmp_path: Path) -> None:
    done = _fails(_project(tmp_path / "proj"), "--database-url", "mysql://db/app")
    assert "cannot start: unsupported database URL 'mysql://db/app': use sqlite:///path or postgresql://" \
        in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 6, done.stderr


def test_a_store_whose_embedder_is_not_installed(tmp_path: Path) -> None:
    folder = _project(tmp_path / "proj")
    config = json.loads((folder / "langgraph.json").read_text())
    if importlib.util.find_spec("langchain_mistralai"):
        pytest.skip("langchain-mistralai is installed here")
    config["store"] = {"index": {"dims": 8, "embed": "mistralai:mistral-embed"}}  # LangChain's provider string
    (folder / "langgraph.json").write_text(json.dumps(config))
    done = _fails(folder)
    assert "cannot start: module 'langchain_mistralai' is not installed" in done.stderr
    assert "-m pip install langchain-mistralai" in done.stderr and "Traceback" not in done.stderr


def test_a_graph_importing_a_missing_package_names_it_and_the_install_command(tmp_path: Path) -> None:
    folder = _project(tmp_path / "proj")
    (folder / "agent.py").write_text("import tinyfoo_not_installed\n" + GRAPH.format(word="x"))
    (folder / "requirements.txt").write_text("tinyfoo-not-installed\n")
    done = _fails(folder)
    assert done.returncode == 2
    assert f"module 'tinyfoo_not_installed' is not installed (imported at {folder / 'agent.py'}:1)" in done.stderr
    assert f"-m pip install -r {folder / 'requirements.txt'}" in done.stderr


def test_dev_reloads_when_the_graph_changes(tmp_path: Path) -> None:
    """`threadline dev` serves the project, and a changed graph file is served without a restart by hand."""
    folder = _project(tmp_path / "proj", word="hello")
    body = {"assistant_id": "agent", "input": {"text": "you"}}
    with serving(folder, command="dev") as (url, _):
        assert httpx.post(f"{url}/runs/wait", json=body, timeout=30).json() == {"text": "hello you"}
        (folder / "agent.py").write_text("def broken(:\n")  # a typo: reported, and dev waits for the fix
        _wait_for(lambda: "waiting for a file of the project to change" in (folder / "server.log").read_text(),
                  folder)
        (folder / "agent.py").write_text(GRAPH.format(word="goodbye"))
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.post(f"{url}/runs/wait", json=body, timeout=30).json()
            except httpx.HTTPError:  # between the old process and the new one
                answer = None
            if answer == {"text": "goodbye you"}:
                break
            assert time.monotonic() < deadline, f"never reloaded: {(folder / 'server.log').read_text()}"
            time.sleep(0.2)
    log = (folder / "server.log").read_text()
    assert "cannot start: " in log and "SyntaxError" in log
    assert "Process SpawnProcess" not in log and log.count("Traceback (most recent call last)") <= 1  # the loader's


def _wait_for(check: Any, folder: Path) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, (folder / "server.log").read_text()
        time.sleep(0.1)


def _readme_block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)
    return next(b for b in blocks if containing in b)


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    """The README's project (its graph file and langgraph.json) served, and its client snippet run, as a user
    copies them; only the server's address differs (a free port)."""
    folder = tmp_path / "my-project"
    folder.mkdir()
    config = _readme_block("json", '"graphs"')  # the first: the complete project's
    (folder / "langgraph.json").write_text(config)
    for spec in json.loads(config)["graphs"].values():
        (folder / spec.split(":")[0]).write_text(_readme_block("python", "StateGraph"))
    client = _readme_block("python", "get_client")
    assert "asyncio.run(main())" in client
    with serving(folder) as (url, _):
        (folder / "client.py").write_text(client.replace("http://localhost:8000", url))
        done = subprocess.run([sys.executable, "client.py"], capture_output=True, text=True, timeout=60, cwd=folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'message': 'hi', 'reply': 'you said: hi'}"
    assert "# prints {'message': 'hi', 'reply': 'you said: hi'}" in client  # what the README promises


@pytest.mark.parametrize("command", ["serve", "dev"])
def test_help_shows_defaults(command: str) -> None:
    done = subprocess.run(threadline_cmd(command, "--help"), capture_output=True, text=True, timeout=60,
                          env=clean_env())
    text = " ".join(done.stdout.split())
    assert "(default: 8000)" in text and "(default: 127.0.0.1)" in text and "(default: info)" in text
    assert "{text,json}" in text


def _idle_then_reused(url: str, idle: float) -> bool:
    """Whether a connection left idle for `idle` s still serves a second request (one connection, read whole:
    http.client does not reconnect a connection it still holds, so a closed one fails the second request)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", "/ok")
        first = connection.getresponse()
        assert first.status == 200 and first.read() == b'{"ok":true}'
        held = connection.sock
        time.sleep(idle)  # the idle time itself is what is tested
        try:
            connection.request("GET", "/ok")
            second = connection.getresponse()
            return second.status == 200 and second.read() == b'{"ok":true}' and connection.sock is held
        except (OSError, http.client.HTTPException):
            return False
    finally:
        connection.close()


@pytest.mark.slow
def test_idle_connections_outlive_clients_idle_expiry(tmp_path: Path) -> None:
    """An idle connection stays open past the 5 s after which uvicorn closed it by default (httpx's own expiry is
    also 5 s: a pooled client then raced the server's close); `--keep-alive-seconds` sets how long."""
    folder = _project(tmp_path / "proj")
    with serving(folder) as (url, _):
        assert _idle_then_reused(url, 6.5)
    with serving(folder, "--keep-alive-seconds", "1") as (url, _):
        assert not _idle_then_reused(url, 2.5)
