"""OpenTelemetry tracing (`pip install 'threadline[otel]'`), configured by the standard `OTEL_*` variables only.

Imported by `threadline.tracing.setup` when those variables turn tracing on, never otherwise. What it records:

- `HTTP`: FastAPI's own server span for each request (it reads the client's `traceparent`), sent to this
  provider (`http_provider`);
- `threadline.run.queued`: from the run's creation to its claim, and `threadline.run`: its execution on a worker
  (attempt, status), both children of the span that created the run, whichever process that was;
- `node <name>`: each LangGraph node (langchain-core callbacks, installed through a configure hook, so no config
  is touched), under the run or the node whose subgraph it is;
- `threadline.checkpoint.put` / `.put_writes` and `threadline.webhook` (whose request carries `traceparent`).

The exporter is `OTEL_TRACES_EXPORTER` (`otlp`, `console`, or any installed exporter's entry point name); `otlp`
speaks `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`, `http/protobuf` unless it says `grpc`. Everything else (endpoint,
headers, sampler, batch sizes, propagators, resource attributes, service name) the SDK reads itself.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Mapping
from contextvars import ContextVar
from datetime import datetime
from importlib.metadata import entry_points, version
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.context import register_configure_hook
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import ProcessResourceDetector, Resource, get_aggregated_resources
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from threadline.tracing import Tracer

_NODE_SPANS: ContextVar[BaseCallbackHandler | None] = ContextVar("threadline_node_spans", default=None)
register_configure_hook(_NODE_SPANS, True)  # every callback manager a run's graph makes gets its handler
_FAILED = ("error", "timeout")
_ARGV = ("process.command_args", "process.command_line")  # never exported: a flag may hold a password


class OTelTracer(Tracer):
    """Spans to an OpenTelemetry tracer provider."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("threadline", version("threadline"))

    @classmethod
    def from_environment(cls, command: str) -> OTelTracer:
        """The provider the `OTEL_*` variables describe, made the process's global one (a graph's own spans go
        there too), exporting in batches."""
        provider = TracerProvider(resource=resource(command))
        for exporter in exporters(os.environ):
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        return cls(provider)

    @classmethod
    def with_processor(cls, processor: SpanProcessor, command: str = "test") -> OTelTracer:
        """A tracer of its own (not the global one) whose spans go to `processor`: for tests."""
        provider = TracerProvider(resource=resource(command))
        provider.add_span_processor(processor)
        return cls(provider)

    def span(self, name: str, attributes: Mapping[str, Any] | None = None, *, client: bool = False) -> Any:
        return self.tracer.start_as_current_span(name, kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
                                                 attributes=dict(attributes or {}))

    def inject(self, headers: dict[str, str]) -> None:
        propagate.inject(headers)

    async def run(self, run: Mapping[str, Any], carrier: Mapping[str, str], execution: Awaitable[Any]) -> Any:
        parent = propagate.extract(dict(carrier))
        attributes = {"threadline.run_id": run["run_id"], "threadline.thread_id": run["thread_id"],
                      "threadline.assistant_id": run["assistant_id"], "threadline.run.attempt": run.get("attempt", 1)}
        created = _nanos(run.get("created_at"))
        continued = "traceparent" in carrier
        if created is not None and continued:
            self._queued(parent, attributes, created)
        with self.tracer.start_as_current_span("threadline.run", context=parent, attributes=attributes,
                                               record_exception=False, set_status_on_exception=False) as span:
            if created is not None and not continued:  # a run no request created (a cron's): its own trace
                self._queued(trace.set_span_in_context(span), attributes, created)
            token = _NODE_SPANS.set(NodeSpans(self.tracer, span))
            try:
                finished = await execution
            except BaseException as exc:  # shutdown, a lost lease: the run goes on elsewhere
                span.set_attribute("threadline.run.status", "released")
                span.record_exception(exc)
                raise
            finally:
                _NODE_SPANS.reset(token)
            status = finished["status"] if finished else "released"  # None: not ours to finish
            span.set_attribute("threadline.run.status", status)
            if status in _FAILED:
                error = (finished or {}).get("error") or {}
                span.set_status(Status(StatusCode.ERROR, f"{status}: {error.get('error', '')}".rstrip(": ")))
            return finished

    def _queued(self, parent: Any, attributes: dict[str, Any], created: int) -> None:
        """The run's time in the queue, from its creation to now (its claim)."""
        self.tracer.start_span("threadline.run.queued", context=parent, kind=SpanKind.CONSUMER,
                               attributes=attributes, start_time=created).end()

    def log_ids(self) -> dict[str, str]:
        found = trace.get_current_span().get_span_context()
        if not found.is_valid:
            return {}
        return {"trace_id": format(found.trace_id, "032x"), "span_id": format(found.span_id, "016x")}

    def annotate(self, attributes: Mapping[str, Any]) -> None:
        trace.get_current_span().set_attributes(dict(attributes))

    def http_provider(self) -> Any:
        return self.provider

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what its batches hold


class NodeSpans(BaseCallbackHandler):
    """A span for each LangGraph node of one run: a chain whose name is its `langgraph_node` metadata. Its
    parent is the span of the nearest node above it (a subgraph's nodes sit under the node that runs the
    subgraph), else the run's."""

    run_inline = True  # called where the node runs, not on a thread of langchain-core's
    raise_error = False

    def __init__(self, tracer: trace.Tracer, root: trace.Span) -> None:
        self.tracer = tracer
        self.root = root
        self.parents: dict[UUID, UUID | None] = {}
        self.spans: dict[UUID, trace.Span] = {}

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                       tags: Any = None, metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.parents[run_id] = parent_run_id
        node = (metadata or {}).get("langgraph_node")
        if node is None or kwargs.get("name") != node:
            return
        attributes: dict[str, Any] = {"langgraph.node": str(node),
                                      "langgraph.step": int((metadata or {}).get("langgraph_step", 0))}
        self.spans[run_id] = self.tracer.start_span(
            f"node {node}", context=trace.set_span_in_context(self._parent(parent_run_id)), attributes=attributes)

    def _parent(self, run_id: UUID | None) -> trace.Span:
        while run_id is not None:
            if run_id in self.spans:
                return self.spans[run_id]
            run_id = self.parents.get(run_id)
        return self.root

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, error)

    def _end(self, run_id: UUID, error: BaseException | None) -> None:
        self.parents.pop(run_id, None)
        span = self.spans.pop(run_id, None)
        if span is None:
            return
        # LangGraph ends an interrupted node with GraphInterrupt, and a node that routes with ParentCommand:
        # control flow, not failures.
        if error is not None and type(error).__name__ not in ("GraphInterrupt", "ParentCommand"):
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()


def resource(command: str) -> Resource:
    """service.name (`OTEL_SERVICE_NAME`, else `threadline`), service.version, the process's attributes and
    `OTEL_RESOURCE_ATTRIBUTES`, which win over ours."""
    # Not argv: a flag may hold a secret (--database-url with its password).
    ours = Resource({"service.name": "threadline", "service.version": version("threadline"),
                     "process.command": f"threadline {command}", "host.name": socket.gethostname()})
    detected = get_aggregated_resources([ProcessResourceDetector()])  # pid, executable, runtime
    detected = Resource({k: v for k, v in detected.attributes.items() if k not in _ARGV})
    from_env = Resource.create({})  # OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    if not (os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")):
        from_env = Resource({k: v for k, v in from_env.attributes.items() if k != "service.name"})
    return detected.merge(ours).merge(from_env)


def exporters(environ: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters `OTEL_TRACES_EXPORTER` names (`otlp` when only an endpoint is given), each built with no
    arguments: it reads its own `OTEL_EXPORTER_*` variables."""
    names = [n.strip().lower() for n in (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    found = {e.name: e for e in entry_points(group="opentelemetry_traces_exporter")}
    out: list[SpanExporter] = []
    for name in names:
        if name == "none":
            continue
        if name == "otlp":  # the spec's default protocol; the SDK's entry point for `otlp` is gRPC's
            protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
            name = "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"
        if name not in found:
            raise RuntimeError(f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides "
                               f"(installed: {', '.join(sorted(found))}); pip install 'threadline[otel]'")
        out.append(found[name].load()())
    return out


def _nanos(stamp: Any) -> int | None:
    if isinstance(stamp, str):
        try:
            stamp = datetime.fromisoformat(stamp)
        except ValueError:
            return None
    return int(stamp.timestamp() * 1e9) if isinstance(stamp, datetime) else None
