"""The figures `/metrics` exports, held per Runtime in its own Prometheus registry.

Names carry LangGraph's `lg_api_` prefix where the reference server exports the same figure, so its
dashboards work unchanged; the figures it lacks use the same prefix. Event figures (requests, finished
runs, open streams) are counted as they happen; queue and worker figures are read at scrape time.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from threadline.storage.records import QueueStats

PREFIX = "lg_api_"
CONTENT_TYPE = CONTENT_TYPE_LATEST
OUTCOMES = ("success", "error", "interrupted", "timeout")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Agent runs last from milliseconds to an hour: the default buckets stop at 10 s.
RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


@dataclass(frozen=True)
class Snapshot:
    """Queue and worker figures read when a scrape arrives. `workers_size` is None without workers."""

    pending: int
    running: int
    oldest_pending_seconds: float
    workers_size: int | None
    workers_busy: int

    @classmethod
    def read(cls, stats: QueueStats, workers_size: int | None, workers_busy: int,
             now: datetime | None = None) -> Snapshot:
        """From `Storage.queue_stats()` (`pending`, `running`, `oldest_pending_at`) and the worker pool."""
        return cls(int(stats.get("pending") or 0), int(stats.get("running") or 0),
                   _age(stats.get("oldest_pending_at"), now or datetime.now(UTC)),
                   workers_size, workers_busy)

    @property
    def saturation(self) -> float:
        return self.workers_busy / self.workers_size if self.workers_size else 0.0


def _age(when: Any, now: datetime) -> float:
    """Seconds since `when` (an ISO string or datetime); 0 for none, or for a run scheduled later."""
    if when is None:
        return 0.0
    moment = when if isinstance(when, datetime) else datetime.fromisoformat(str(when))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (now - moment).total_seconds())


class _Live(Collector):
    """Yields the snapshot taken for the scrape in progress (none outside a scrape)."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        if s is None:
            return
        yield GaugeMetricFamily(PREFIX + "num_pending_runs", "Runs waiting in the queue (all processes).",
                                value=s.pending)
        yield GaugeMetricFamily(PREFIX + "num_running_runs", "Runs executing now (all processes).", value=s.running)
        yield GaugeMetricFamily(PREFIX + "pending_runs_wait_time_max",
                                "Seconds the oldest pending run has waited since it became available.",
                                value=s.oldest_pending_seconds)
        if s.workers_size is not None:
            yield GaugeMetricFamily(PREFIX + "workers_max", "Run slots in this process.", value=s.workers_size)
            yield GaugeMetricFamily(PREFIX + "workers_active", "Busy run slots in this process.", value=s.workers_busy)
            yield GaugeMetricFamily(PREFIX + "workers_available", "Idle run slots in this process.",
                                    value=s.workers_size - s.workers_busy)
            yield GaugeMetricFamily(PREFIX + "workers_saturation", "Busy run slots / run slots, in this process.",
                                    value=s.saturation)


class Metrics:
    """One Runtime's metrics. A registry of its own, so several apps in one process never share counts."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.http_requests = Counter(PREFIX + "http_requests", "HTTP requests by method, route template and status.",
                                     ["method", "path", "status"], registry=self.registry)
        self.http_latency = Histogram(PREFIX + "http_requests_latency_seconds",
                                      "Seconds from request to the end of the response, by method and route template.",
                                      ["method", "path"], registry=self.registry)
        self.runs_finished = Counter(PREFIX + "runs_finished", "Runs this process's workers finished, by status.",
                                     ["status"], registry=self.registry)
        self.run_duration = Histogram(PREFIX + "run_duration_seconds", "Seconds from a run's claim to its end.",
                                      buckets=RUN_BUCKETS, registry=self.registry)
        self.stream_subscribers = Gauge(PREFIX + "stream_subscribers", "Event streams being served now.",
                                        registry=self.registry)
        # Streams' read-ahead (`api/sse.py: Pump`), summed when scraped: nothing is counted per event.
        self._read_ahead: weakref.WeakSet[Any] = weakref.WeakSet()
        self.stream_read_ahead = Gauge(
            PREFIX + "stream_read_ahead_bytes", "Bytes of events read for event streams' clients in this process "
            "and not yet sent (bounded per stream).", registry=self.registry)
        self.stream_read_ahead.set_function(lambda: float(sum(r.held for r in list(self._read_ahead))))
        self.queue_cap = Gauge(PREFIX + "queue_cap", "The cap on pending + running runs (max_active_runs); 0: none.",
                               registry=self.registry)
        self.stream_slow_disconnects = Counter(
            PREFIX + "stream_slow_disconnects", "Event streams closed because their client stopped reading.",
            registry=self.registry)
        self.stream_replay_gaps = Counter(
            PREFIX + "stream_replay_gaps",
            "Resumes (Last-Event-ID) some of whose events were no longer buffered: the client missed them.",
            registry=self.registry)
        self.rate_limited_requests = Counter(
            PREFIX + "rate_limited_requests",
            "Requests refused with 429 by a rate limit, by route template and budget.",
            ["path", "budget"], registry=self.registry)
        self.cron_runs = Counter(PREFIX + "cron_runs_created", "Runs this process's cron scheduler created, by "
                                 "kind (thread: on the cron's thread; stateless: on a new thread).", ["kind"],
                                 registry=self.registry)
        for outcome in OUTCOMES:
            self.runs_finished.labels(status=outcome)
        for kind in ("thread", "stateless"):
            self.cron_runs.labels(kind=kind)
        self._live = _Live()
        self._requests: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self.registry.register(self._live)

    def request_finished(self, method: str, path: str, status: int, seconds: float) -> None:
        """`path` is the route template (`/threads/{thread_id}`), never the raw path: cardinality stays bounded."""
        method = method if method in METHODS else "other"
        # The labelled children, looked up once per label set (the set is bounded: see above).
        children = self._requests.get((method, path, status))
        if children is None:
            children = self._requests[(method, path, status)] = (
                self.http_requests.labels(method=method, path=path, status=str(status)),
                self.http_latency.labels(method=method, path=path))
        children[0].inc()
        children[1].observe(seconds)

    def run_finished(self, status: str, seconds: float | None) -> None:
        """`seconds` from its claim to its end; None for a run ended by the sweeper (its worker is gone)."""
        self.runs_finished.labels(status=status).inc()
        if seconds is not None:
            self.run_duration.observe(seconds)

    def stream_slow_disconnect(self) -> None:
        self.stream_slow_disconnects.inc()

    def replay_gap(self) -> None:
        self.stream_replay_gaps.inc()

    def rate_limited(self, path: str, budget: str) -> None:
        self.rate_limited_requests.labels(path=path, budget=budget).inc()

    def cron_run_created(self, kind: str) -> None:
        self.cron_runs.labels(kind=kind).inc()

    def track_read_ahead(self, reader: Any) -> None:
        """Count `reader.held` (bytes) in `stream_read_ahead_bytes` for as long as `reader` lives."""
        self._read_ahead.add(reader)

    def stream_open(self) -> AbstractContextManager[Any]:
        """Counts one open event stream for as long as the block runs."""
        return self.stream_subscribers.track_inprogress()

    def prometheus(self, snapshot: Snapshot) -> bytes:
        """The text exposition format (`CONTENT_TYPE`)."""
        self._live.snapshot = snapshot  # no await until it is cleared: concurrent scrapes cannot mix
        try:
            return generate_latest(self.registry)
        finally:
            self._live.snapshot = None

    def as_json(self, s: Snapshot) -> dict[str, Any]:
        """The same figures as one JSON object (LangGraph's `queue`/`api`/`workers` keys, plus ours)."""
        requests = [{**sample.labels, "count": int(sample.value)} for sample in _samples(self.http_requests, "_total")]
        duration = {sample.name.rsplit("_", 1)[-1]: sample.value
                    for sample in _samples(self.run_duration, "_count", "_sum")}
        out: dict[str, Any] = {
            "queue": {"n_pending": s.pending, "n_running": s.running,
                      "pending_runs_wait_time_max": s.oldest_pending_seconds},
            "api": {"http_requests_total": requests},
            "runs": {"finished": {sample.labels["status"]: int(sample.value)
                                  for sample in _samples(self.runs_finished, "_total")},
                     "duration_seconds": {"count": int(duration.get("count", 0)), "sum": duration.get("sum", 0.0)}},
            "streams": {"subscribers": int(next(_samples(self.stream_subscribers, "subscribers")).value)},
            "crons": {"runs_created": {sample.labels["kind"]: int(sample.value)
                                       for sample in _samples(self.cron_runs, "_total")}},
        }
        if s.workers_size is not None:
            out["workers"] = {"max": s.workers_size, "active": s.workers_busy,
                              "available": s.workers_size - s.workers_busy, "saturation": s.saturation}
        return out


def _samples(metric: Counter | Gauge | Histogram, *suffixes: str) -> Iterator[Any]:
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffixes):
                yield sample
