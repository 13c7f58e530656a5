"""Tracing: the narrow interface the API and the core call, whatever records the traces.

- **OpenTelemetry** (`threadline.otel`), configured by the standard `OTEL_*` variables only and off unless they
  name an exporter or an OTLP endpoint. Off, `threadline.otel` is never imported, no tracer provider is set,
  and every hook here is a shared no-op (a context manager that does nothing, an empty carrier).
- **LangSmith**, as LangGraph's server does it: with `LANGSMITH_TRACING=true` each run's graph is traced by
  langchain-core's own tracer, under the run's id, with its metadata (`traced_run`).
- **Request ids**: the id of the request being served (its `x-request-id`, else a new one), for log lines.

A run carries its trace across processes in its stored kwargs (`TRACE_KEY`): the W3C `traceparent` (and
`tracestate`) of the request that created it, and that request's id. The worker that executes the run continues
that trace (`traced_run`), and its webhook request carries it on (`carrier`).

A leaf: imports nothing of Threadline's.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Awaitable, Coroutine, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Final

#: The run kwargs key holding a run's trace carrier (never shown in the run's public `kwargs`).
TRACE_KEY: Final = "trace"
REQUEST_HEADER = "x-request-id"
#: The id of the request (or of the request that created the run) this task serves; for log lines.
REQUEST_ID: ContextVar[str | None] = ContextVar("threadline_request_id", default=None)
_TRUE = ("1", "true", "yes", "on")
_NULL = contextlib.nullcontext()


class Tracer:
    """What the API and the core call. This base records nothing; `threadline.otel.OTelTracer` records spans."""

    enabled = False

    def span(self, name: str, attributes: Mapping[str, Any] | None = None, *, client: bool = False) -> Any:
        """A context manager: a child span of the current one for its block (`client`: an outgoing request)."""
        return _NULL

    def inject(self, headers: dict[str, str]) -> None:
        """Add the current span's W3C headers (`traceparent`, `tracestate`) to `headers`."""

    async def run(self, run: Mapping[str, Any], carrier: Mapping[str, str], execution: Awaitable[Any]) -> Any:
        """Await a claimed run's execution inside its spans (its time queued, then the run and its nodes)."""
        return await execution

    def log_ids(self) -> dict[str, str]:
        """The current trace and span ids, for log lines ({} outside a span)."""
        return {}

    def annotate(self, attributes: Mapping[str, Any]) -> None:
        """Set attributes on the current span."""

    def http_provider(self) -> Any:
        """The tracer provider the web framework's own HTTP spans go to (None: tracing is off)."""
        return None

    def shutdown(self) -> None:
        """Export what is buffered; called once as the process exits."""


_tracer: Tracer = Tracer()


def tracer() -> Tracer:
    return _tracer


def otel_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """OpenTelemetry is on when the standard variables name an exporter (`OTEL_TRACES_EXPORTER`, not `none`) or
    an OTLP endpoint, and `OTEL_SDK_DISABLED` is not true. LangGraph's server's `OTEL_ENABLED`, when set, decides
    instead (true: the OTLP exporter unless another is named)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_ENABLED", "").strip():
        return env["OTEL_ENABLED"].strip().lower() in _TRUE
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def setup(command: str, environ: Mapping[str, str] | None = None) -> Tracer:
    """Install the tracer the environment asks for, once per process (`threadline serve`, `worker`, `dev`)."""
    global _tracer
    if otel_wanted(environ) and not _tracer.enabled:
        from threadline.otel import OTelTracer  # the SDK is imported only here

        _tracer = OTelTracer.from_environment(command)
    return _tracer


@contextlib.contextmanager
def installed(chosen: Tracer) -> Iterator[Tracer]:
    """Use `chosen` for the block (tests: a tracer with an in-memory exporter), then the one before."""
    global _tracer
    before, _tracer = _tracer, chosen
    try:
        yield chosen
    finally:
        _tracer = before


def shutdown() -> None:
    _tracer.shutdown()
    if langsmith_wanted():
        from langchain_core.tracers.langchain import wait_for_all_tracers

        wait_for_all_tracers()  # LangSmith's client sends in the background: the last runs' traces too


def carrier() -> dict[str, str]:
    """What a run created now stores to continue this trace where it executes: the current span's W3C headers
    and the request's id ({} when there is neither)."""
    out: dict[str, str] = {}
    _tracer.inject(out)
    request_id = REQUEST_ID.get()
    if request_id:
        out[REQUEST_HEADER] = request_id
    return out


def request_id(given: str | None) -> str:
    """The id of a request: the one its client sent (`x-request-id`, up to 128 characters), else a new one."""
    if given and len(given) <= 128 and given.isprintable():
        return given
    return uuid.uuid4().hex


def traced_run(run: Mapping[str, Any], execution: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
    """A claimed run's execution, continued in the trace and under the request id of the request that created
    it, and traced by LangSmith when `LANGSMITH_TRACING` is on. Returned as is when there is nothing to do."""
    stored = (run.get("kwargs") or {}).get(TRACE_KEY) or {}
    if langsmith_wanted():
        execution = _langsmith(run, execution)
    if not stored and not _tracer.enabled:
        return execution
    return _continued(run, stored, execution)


async def _continued(run: Mapping[str, Any], stored: Mapping[str, str], execution: Awaitable[Any]) -> Any:
    if stored.get(REQUEST_HEADER):
        REQUEST_ID.set(stored[REQUEST_HEADER])  # this task's own context
    return await _tracer.run(run, stored, execution)


def langsmith_wanted() -> bool:
    """LangSmith tracing, as langchain-core turns it on: `LANGSMITH_TRACING` (or `LANGCHAIN_TRACING_V2`) true."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE
               for name in ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"))


async def _langsmith(run: Mapping[str, Any], execution: Awaitable[Any]) -> Any:
    """The run's graph traced by LangSmith as LangGraph's server traces it: langchain-core's tracer takes the
    run's id as its root run's id and the run's config metadata (run, thread, assistant and graph ids, the
    run's own metadata) from the config the executor builds; this adds the server's, and the project from
    `LANGSMITH_PROJECT`."""
    from importlib.metadata import version

    from langsmith.run_helpers import tracing_context

    metadata = {"run_attempt": run.get("attempt", 1), "langgraph_version": version("langgraph"),
                "threadline_version": version("threadline")}
    options: dict[str, Any] = {}
    asked = (run.get("kwargs") or {}).get("langsmith_tracer") or {}
    if asked.get("project_name"):  # the run's `langsmith_tracer`: its project too, as LangGraph's server sends it
        from langsmith.utils import get_tracer_project

        updates = {"reference_example_id": asked["example_id"]} if asked.get("example_id") else None
        options["replicas"] = [{"project_name": asked["project_name"], "updates": updates},
                               {"project_name": get_tracer_project(), "updates": None}]
    with tracing_context(enabled=True, metadata=metadata, **options):
        return await execution
