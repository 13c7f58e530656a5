"""LangSmith tracing as LangGraph's server does it: with `LANGSMITH_TRACING=true` (and an API key), each run's
graph is traced under the run's id, with its thread, assistant and graph ids and its metadata. Sent to a
receiver this test runs on 127.0.0.1 (`LANGSMITH_ENDPOINT`), never to the network."""

from __future__ import annotations

import email.parser
import email.policy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import PROJECT
from tests.processes import serving
from tests.test_tracing import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]  # a server process, started for real


def posted_runs(receiver: Receiver) -> list[dict[str, Any]]:
    """Every run LangSmith's client sent: created (`post`) and updated (`patch`), from its multipart or batch
    bodies, each with its `inputs`/`outputs` parts merged in."""
    runs: dict[str, dict[str, Any]] = {}
    for path, headers, body in list(receiver.requests):
        if path.startswith("/runs/multipart"):
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"content-type: " + headers["content-type"].encode() + b"\r\n\r\n" + body)
            for part in message.iter_parts():
                name = part.get_param("name", header="content-disposition")
                data = part.get_payload(decode=True)
                assert isinstance(name, str) and isinstance(data, bytes)  # a named part with a JSON body
                kind, run_id, *field = name.split(".")
                payload = json.loads(data)
                run = runs.setdefault(run_id, {"id": run_id})
                run.update({field[0]: payload} if field else payload)
        elif path.startswith("/runs/batch"):
            batch = json.loads(body)
            for run in [*batch.get("post", []), *batch.get("patch", [])]:
                runs.setdefault(run["id"], {}).update(run)
    return list(runs.values())


@pytest.fixture
def smith() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def test_each_run_is_traced_under_its_id_with_its_metadata(smith: Receiver, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"LANGSMITH_TRACING": "true", "LANGSMITH_API_KEY": "lsv2-test", "LANGSMITH_ENDPOINT": smith.url,
                       "LANGSMITH_PROJECT": "threadline-test"}.items():
        monkeypatch.setenv(key, value)
    database = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with serving(tmp_path, "--config", str(PROJECT), "--database-url", database) as (url, _):
        tid = httpx.post(f"{url}/threads", json={}).json()["thread_id"]
        run = httpx.post(f"{url}/threads/{tid}/runs", json={
            "assistant_id": "nested", "input": {"items": []}, "metadata": {"customer": "acme"}}).json()
        assert httpx.get(f"{url}/threads/{tid}/runs/{run['run_id']}/join", timeout=30).status_code == 200
        # As on LangGraph's server, a run's `langsmith_tracer` sends its trace to another project too.
        other = httpx.post(f"{url}/threads/{tid}/runs", json={
            "assistant_id": "echo", "input": {"messages": []}, "langsmith_tracer": {"project_name": "evals"}}).json()
        assert httpx.get(f"{url}/threads/{tid}/runs/{other['run_id']}/join", timeout=30).status_code == 200
        deadline = time.monotonic() + 30
        while not (any(r["id"] == run["run_id"] and r.get("end_time") for r in posted_runs(smith))
                   and any(r.get("session_name") == "evals" and r.get("end_time") for r in posted_runs(smith))):
            assert time.monotonic() < deadline, f"sent: {[p for p, _, _ in smith.requests]}\n" \
                                                f"{(tmp_path / 'server.log').read_text()}"
            time.sleep(0.2)
    sent = {r["id"]: r for r in posted_runs(smith)}
    root = sent[run["run_id"]]  # the graph's root run has the run's id
    metadata = root["extra"]["metadata"]
    assert {k: metadata.get(k) for k in ("run_id", "thread_id", "graph_id", "assistant_id", "customer")} == {
        "run_id": run["run_id"], "thread_id": tid, "graph_id": "nested", "assistant_id": run["assistant_id"],
        "customer": "acme"}
    assert metadata["run_attempt"] == 1 and metadata["langgraph_version"] and metadata["threadline_version"]
    assert root["session_name"] == "threadline-test" and root.get("parent_run_id") is None
    nodes = {r["name"] for r in sent.values() if r.get("trace_id") == root["trace_id"]}
    assert {"parent_step", "child", "child_step"} <= nodes  # the graph's nodes, in the run's trace
    roots = [r for r in sent.values() if r.get("parent_run_id") is None
             and (r.get("extra") or {}).get("metadata", {}).get("run_id") == other["run_id"]]
    assert {r["session_name"] for r in roots} == {"evals", "threadline-test"}
