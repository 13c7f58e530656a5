"""One trace across processes: a run created through an API process and executed by a worker process, on
PostgreSQL + Redis, both exporting over OTLP/HTTP (configured by OTEL_* variables alone) to a receiver this
test runs on 127.0.0.1, which decodes each `ExportTraceServiceRequest`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytest.importorskip("opentelemetry.proto", reason="the test extra's opentelemetry-proto is not installed")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.services import ScaleOut
from tests.test_scaleout import Cluster
from tests.test_tracing import CLIENT_SPAN, TRACE_ID, TRACEPARENT, Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]  # an API and a worker process, started for real


@dataclass(frozen=True)
class Span:
    name: str
    span_id: str
    parent: str
    process: str  # the resource's process.command: which process sent it
    attributes: dict[str, object]
    resource: dict[str, object]


def _value(v: object) -> object:
    kind = v.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(v, kind) if kind else None


def received_spans(receiver: Receiver) -> list[Span]:
    out: list[Span] = []
    for path, _, body in list(receiver.requests):
        if not path.endswith("/v1/traces"):
            continue
        for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                out.extend(Span(s.name, s.span_id.hex(), s.parent_span_id.hex(), str(resource.get("process.command")),
                                {a.key: _value(a.value) for a in s.attributes}, resource)
                           for s in scope.spans if s.trace_id.hex() == TRACE_ID)
    return out


@pytest.fixture
def collector() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def traced(scaleout_services: ScaleOut, tmp_path: Path, collector: Receiver,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    for key, value in {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100",
                       "OTEL_SERVICE_NAME": "threadline-test"}.items():
        monkeypatch.setenv(key, value)  # the processes' environment (Cluster passes os.environ on)
    cluster = Cluster(scaleout_services.fresh(), tmp_path)
    try:
        cluster.start_worker()
        cluster.start_api()
        yield cluster
    finally:
        cluster.close()


def test_a_run_is_one_trace_from_the_api_process_to_the_worker_process(traced: Cluster,
                                                                       collector: Receiver) -> None:
    base = traced.apis[0]
    tid = httpx.post(f"{base}/threads", json={}).json()["thread_id"]
    created = httpx.post(f"{base}/threads/{tid}/runs", json={"assistant_id": "nested", "input": {"items": []}},
                         headers={"traceparent": TRACEPARENT, "x-request-id": "req-from-api"})
    run_id = created.json()["run_id"]
    assert httpx.get(f"{base}/threads/{tid}/runs/{run_id}/join", timeout=60).status_code == 200
    wanted = {"threadline.run", "threadline.run.queued", "node parent_step", "node child", "node child_step"}
    deadline = time.monotonic() + 60
    while True:  # each process exports in batches (OTEL_BSP_SCHEDULE_DELAY)
        spans = received_spans(collector)
        names = {s.name for s in spans}
        if wanted <= names and any(s.parent == CLIENT_SPAN for s in spans):
            break
        assert time.monotonic() < deadline, f"spans of the trace so far: {sorted(names)}\n{traced.logs()}"
        time.sleep(0.2)
    by_id = {s.span_id: s for s in spans}
    (http,) = [s for s in spans if s.parent == CLIENT_SPAN]  # the client's span is the trace's root
    assert http.process == "threadline serve" and "POST" in http.name
    (run,) = [s for s in spans if s.name == "threadline.run"]
    (queued,) = [s for s in spans if s.name == "threadline.run.queued"]
    assert run.process == queued.process == "threadline worker"
    assert run.attributes["threadline.run_id"] == run_id and run.attributes["threadline.run.status"] == "success"

    def ancestors(span: Span) -> list[str]:
        out = []
        while span.parent in by_id:
            span = by_id[span.parent]
            out.append(span.span_id)
        return out

    # Linked by the traceparent the API process stored with the run: the worker's spans hang under its request.
    assert http.span_id in ancestors(run) and http.span_id in ancestors(queued)
    nodes = [s for s in spans if s.name.startswith("node ")]
    assert all(run.span_id in ancestors(n) and n.process == "threadline worker" for n in nodes)
    assert {s.resource["service.name"] for s in spans} == {"threadline-test"}
    assert all(s.resource["service.version"] and s.resource["process.pid"] for s in spans)
    # The worker's log lines for the run carry the id of the request that created it, and its trace id.
    worker_log = "\n".join(p.read_text() for p in traced.tmp.glob("worker-*.log"))
    started = [line for line in worker_log.splitlines() if "run started" in line and run_id in line]
    assert len(started) == 1 and "request_id=req-from-api" in started[0] and f"trace_id={TRACE_ID}" in started[0]
