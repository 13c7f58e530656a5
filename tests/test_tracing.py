"""Tracing a run (threadline.tracing, threadline.otel): in one process here, on SQLite, with spans kept in memory;
across an API process and a worker process on PostgreSQL + Redis, exported over OTLP, in test_tracing_scaleout.py.

What an operator sees: one trace from the client's request to the run's nodes, checkpoints and webhook, with
the client's `traceparent` as its root; log lines that carry the trace id and the request id; and nothing of
OpenTelemetry's SDK loaded when the `OTEL_*` variables do not ask for it."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import PROJECT
from tests.processes import ROOT
from threadline import logs, tracing
from threadline.api.app import create_app
from threadline.otel import OTelTracer
from threadline.settings import Settings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


class Receiver:
    """An HTTP server on 127.0.0.1 that records each request's path, headers and body, and answers 200."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.arrived = threading.Event()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                received.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                received.arrived.set()
                # OTLP/HTTP wants an ExportTraceServiceResponse (empty: every span accepted); others JSON.
                otlp = self.path.endswith("/v1/traces")
                answer = b"" if otlp else b"{}"
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf" if otlp else "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_GET(self) -> None:
                self.do_POST()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    with tracing.installed(OTelTracer.with_processor(SimpleSpanProcessor(exporter))):
        yield exporter


@pytest.fixture
async def client(spans: InMemorySpanExporter, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    # The app is made once the tracer is installed: FastAPI's own HTTP spans go to its provider.
    app = create_app(Settings(config=str(PROJECT), database_url=f"sqlite:///{tmp_path / 'db.sqlite'}", workers=2))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(manager.app), base_url="http://tl") as http:
            yield http


def _named(found: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def _ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[ReadableSpan]:
    out = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        out.append(span)
    return out


class Captured(logging.Handler):
    """Records as our log handler sees them: with the context's fields (`logs.ContextFields`)."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(logs.ContextFields())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_one_trace_from_the_request_to_nodes_checkpoints_and_webhook(
        client: httpx.AsyncClient, spans: InMemorySpanExporter, receiver: Receiver,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="threadline")
    captured = Captured()
    logging.getLogger("threadline").addHandler(captured)
    try:
        tid = (await client.post("/threads", json={})).json()["thread_id"]
        answer = await client.post(f"/threads/{tid}/runs/wait", json={
            "assistant_id": "nested", "input": {"items": []}, "webhook": f"{receiver.url}/hooks/done"},
            headers={"traceparent": TRACEPARENT, "x-request-id": "req-42"})
        assert answer.status_code == 200, answer.text
        assert await asyncio.to_thread(receiver.arrived.wait, 10), "no webhook"
        for _ in range(500):  # its span ends once the receiver has answered
            if _named(spans.get_finished_spans(), "threadline.webhook"):
                break
            await asyncio.sleep(0.01)
    finally:
        logging.getLogger("threadline").removeHandler(captured)
    found = [s for s in spans.get_finished_spans() if s.context.trace_id == int(TRACE_ID, 16)]
    by_id = {s.context.span_id: s for s in found}
    (http,) = [s for s in found if s.parent is not None and s.parent.span_id == int(CLIENT_SPAN, 16)]
    assert "POST" in http.name and http.attributes["http.request.header.x-request-id"] == "req-42"
    (run,) = _named(found, "threadline.run")
    assert run.attributes["threadline.thread_id"] == tid and run.attributes["threadline.run.attempt"] == 1
    assert run.attributes["threadline.run.status"] == "success"
    assert http in _ancestors(run, by_id)
    (queued,) = _named(found, "threadline.run.queued")
    assert queued.attributes["threadline.run_id"] == run.attributes["threadline.run_id"]
    assert http in _ancestors(queued, by_id)
    (parent_step,) = _named(found, "node parent_step")
    (child,) = _named(found, "node child")
    (child_step,) = _named(found, "node child_step")  # the subgraph's node, under the node that ran it
    assert _ancestors(parent_step, by_id)[0] is run and _ancestors(child, by_id)[0] is run
    assert _ancestors(child_step, by_id)[0] is child
    puts = _named(found, "threadline.checkpoint.put")
    assert puts and all(run in _ancestors(p, by_id) for p in puts)
    (webhook,) = _named(found, "threadline.webhook")
    assert run in _ancestors(webhook, by_id)
    # The receiver can continue the trace: the webhook's request carried it.
    ((path, headers, _),) = receiver.requests
    assert path == "/hooks/done" and headers["traceparent"].split("-")[1] == TRACE_ID
    started = [r for r in captured.records if r.getMessage() == "run started"]
    assert [(r.request_id, r.trace_id) for r in started] == [("req-42", TRACE_ID)]  # type: ignore[attr-defined]


async def test_a_queued_run_continues_the_trace_of_the_request_that_created_it(
        client: httpx.AsyncClient, spans: InMemorySpanExporter) -> None:
    tid = (await client.post("/threads", json={})).json()["thread_id"]
    created = await client.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", "input": {"messages": []}},
                                headers={"traceparent": TRACEPARENT})
    run_id = created.json()["run_id"]
    assert "trace" not in created.json()["kwargs"]  # stored with the run, never shown
    assert (await client.get(f"/threads/{tid}/runs/{run_id}/join")).status_code == 200
    (run,) = [s for s in _named(spans.get_finished_spans(), "threadline.run")
              if s.attributes["threadline.run_id"] == run_id]
    assert format(run.context.trace_id, "032x") == TRACE_ID


async def test_a_run_no_traced_request_created_is_a_trace_of_its_own(spans: InMemorySpanExporter) -> None:
    """A cron's run, or one created with tracing off: its queue wait and execution still share one trace."""
    run = {"run_id": "r1", "thread_id": "t1", "assistant_id": "a1", "attempt": 1,
           "created_at": "2026-12-02T06:00:00+00:00"}

    async def execution() -> dict[str, Any]:
        return {**run, "status": "success"}

    assert (await tracing.tracer().run(run, {"x-request-id": "r"}, execution()))["status"] == "success"
    (executed,) = _named(spans.get_finished_spans(), "threadline.run")
    (queued,) = _named(spans.get_finished_spans(), "threadline.run.queued")
    assert executed.parent is None and queued.parent is not None
    assert queued.parent.span_id == executed.context.span_id and queued.start_time < executed.start_time


async def test_a_failed_run_is_an_error_span(client: httpx.AsyncClient, spans: InMemorySpanExporter) -> None:
    tid = (await client.post("/threads", json={})).json()["thread_id"]
    await client.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "failing", "input": {}})
    (run,) = _named(spans.get_finished_spans(), "threadline.run")
    assert run.attributes["threadline.run.status"] == "error"
    assert run.status.status_code.name == "ERROR"


@pytest.mark.e2e  # a fresh interpreter, to see what it imports
def test_off_by_default_and_then_nothing_of_ours_is_loaded() -> None:
    """Without OTEL_* variables asking for it: our OpenTelemetry module, the exporters and a tracer provider are
    never loaded, even once a server's modules are. (langsmith's client, which langchain-core imports, imports
    `opentelemetry.sdk.trace` itself when the SDK is installed: that is not ours to avoid.)"""
    code = ("import sys; from threadline import tracing; import threadline.api.app, threadline.core.worker; "
            "from opentelemetry import trace; t = tracing.setup('serve', {'OTEL_SERVICE_NAME': 'x'}); "
            "print(t.enabled, type(trace.get_tracer_provider()).__name__, "
            "sorted(m for m in sys.modules if m.startswith(('opentelemetry.exporter', 'threadline.otel'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "False ProxyTracerProvider []", out.stderr


@pytest.mark.parametrize(("env", "wanted"), [
    ({}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_ENABLED": "true"}, True),  # LangGraph's server's switch
    ({"OTEL_ENABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
])
def test_which_variables_turn_it_on(env: dict[str, str], wanted: bool) -> None:
    assert tracing.otel_wanted(env) is wanted


def test_resource_names_the_service_and_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from threadline.otel import resource

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
    monkeypatch.setattr(sys, "argv", ["threadline", "worker", "--database-url", "postgresql://u:secret@db/x"])
    attributes = resource("worker").attributes
    assert attributes["service.name"] == "threadline" and attributes["service.version"]
    assert attributes["process.command"] == "threadline worker" and attributes["process.pid"]
    assert attributes["deployment.environment"] == "staging"
    assert not [v for v in attributes.values() if "secret" in str(v)]  # argv (--database-url) is never exported
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agents-eu")
    assert resource("serve").attributes["service.name"] == "agents-eu"
