"""Prometheus metrics, all prefixed ``hitl_``.

Three kinds, so that every replica serves the same figures and scrapes through a load balancer
agree: figures read from Redis at each scrape (``RedisState``); counters and histograms each
process increments in ``LOCAL`` and adds up in Redis (:mod:`serve_app.shared_metrics`, rendered
from there); and gauges of this process alone (its dispatcher's calls, its embedding cache).
Aggregate across instances with ``max()``, never ``sum()``, except the per-process gauges."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from statecore.counters import STATUSES, Snapshot

from .shared_metrics import Shared

REGISTRY = CollectorRegistry(auto_describe=True)  # what /metrics renders
LOCAL = CollectorRegistry(auto_describe=True)  # this process's counters and histograms: rendered via Redis

JOBS_CREATED = Counter("hitl_jobs_created_total", "Jobs accepted by POST /jobs (replays excluded)", registry=LOCAL)
INTERVENTIONS = Counter(
    "hitl_interventions_total", "Intervention requests by outcome code", ["outcome"], registry=LOCAL
)
OUTBOX_LAG = Gauge("hitl_outbox_pending", "Outbox commands not yet acknowledged by a dispatcher", registry=REGISTRY)
NODE_SECONDS = Histogram(
    "hitl_node_duration_seconds",
    "Model node run time by node type and outcome",
    ["node_type", "outcome"],
    registry=LOCAL,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
REPORTS = Counter("hitl_reports_total", "Node reports by result (OK, DUPLICATE, IGNORED)", ["result"], registry=LOCAL)
INSPECTOR_TIMEOUTS = Counter(
    "hitl_inspector_timeouts_total",
    "Nodes timed out by the inspector after their deadline",
    ["node_type"],
    registry=LOCAL,
)
INSPECTOR_LOST = Counter(
    "hitl_inspector_lost_total",
    "Running nodes whose heartbeat lapsed, re-dispatched (or failed after their last attempt) by the inspector",
    ["node_type"],
    registry=LOCAL,
)
STORE_RESETS = Counter(
    "hitl_store_resets_total",
    "Times this process found Redis come back empty (its store identity changed); each writes a report",
    registry=LOCAL,
)
JOBS_RESTORED = Counter(
    "hitl_jobs_restored_total",
    "Live jobs Redis had lost, given back from the archive's live mirror without an admin, by how they were "
    "found (read: a request asked for one; sweep: the archiver's mirror pass) and outcome",
    ["how", "outcome"],
    registry=LOCAL,
)
EMBEDDING_CACHE = Gauge(
    "hitl_embedding_cache",
    "SAM image-embedding cache counters per model deployment "
    "(memory_hits, store_hits, misses, encoder_forwards; as reported by one replica)",
    ["deployment", "kind"],
    registry=REGISTRY,
)
DISPATCH_CALLS = Gauge(
    "hitl_dispatcher_calls",
    "Model calls this process's dispatcher has outstanding, per deployment (serve_app.capacity)",
    ["deployment"],
    registry=REGISTRY,
)
DISPATCH_LIMIT = Gauge(
    "hitl_dispatcher_call_limit",
    "The most calls this process's dispatcher may have outstanding per deployment: running replicas x "
    "max_ongoing_requests (+1 queued per replica), shared among the Api replicas",
    ["deployment"],
    registry=REGISTRY,
)
SSE_STREAMS = Gauge("hitl_sse_streams", "Open SSE streams in this process", registry=REGISTRY)
HTTP_SECONDS = Histogram(
    "hitl_http_request_duration_seconds",
    "HTTP request latency by route and status",
    ["route", "status"],
    registry=LOCAL,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)


# Counters held in Redis (statecore.counters): every API replica reports the same values, so
# aggregate them across instances with max(), never sum().
_REDIS_COUNTERS = {
    "submitted": ("hitl_jobs_submitted", "Jobs created (every replica, from Redis)"),
    "finished": ("hitl_jobs_finished", "Jobs that reached a terminal status (from Redis)"),
    "user_cancelled": ("hitl_jobs_user_cancelled", "Jobs cancelled by a user or an admin (from Redis)"),
    "node_starts": ("hitl_node_starts", "Node attempts started: every NODE_STARTED (from Redis)"),
    "node_retries": ("hitl_node_retries", "Node attempts after the first: NODE_STARTED with attempt > 1 (from Redis)"),
    "node_results": ("hitl_node_results", "Node results written back and applied (from Redis)"),
    "writeback_failures": ("hitl_writeback_failures", "Write-backs of a node result that failed (from Redis)"),
    "dead_letters": ("hitl_dead_letters", "Results or commands given up on and kept as dead letters (from Redis)"),
}


class RedisState(Collector):
    """The metrics read from Redis at each scrape (``update``); absent until a read succeeded,
    and ``hitl_metrics_store_up`` 0 while the last read failed."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.up = False

    def update(self, snapshot: Snapshot | None) -> None:
        self.up = snapshot is not None
        if snapshot is not None:
            self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("hitl_metrics_store_up", "1 when the last scrape read Redis", value=int(self.up))
        s = self.snapshot
        if s is None:
            return
        jobs = GaugeMetricFamily("hitl_jobs", "Jobs stored, by status (every status; from Redis)", labels=["status"])
        for status in STATUSES:
            jobs.add_metric([status], s.by_status.get(status, 0))
        yield jobs
        yield GaugeMetricFamily(
            "hitl_jobs_waiting_on_person", "Jobs in a WAITING status (an open pause)", value=s.waiting
        )
        c = s.coverage
        yield GaugeMetricFamily(
            "hitl_terminal_coverage_ratio",
            "Jobs submitted in the coverage window: terminal / (submitted - waiting on a person - user-cancelled); "
            "1 when that is 0",
            value=c.ratio,
        )
        window = GaugeMetricFamily(
            "hitl_coverage_window_jobs",
            "Jobs submitted in the coverage window, by what became of them",
            labels=["kind"],
        )
        for kind, n in (
            ("submitted", c.submitted),
            ("terminal", c.terminal),
            ("waiting", c.waiting),
            ("user_cancelled", c.user_cancelled),
        ):
            window.add_metric([kind], n)
        yield window
        yield GaugeMetricFamily("hitl_coverage_window_seconds", "The coverage window", value=c.window_s)
        for field, (name, doc) in _REDIS_COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=s.totals.get(field, 0))
        yield GaugeMetricFamily("hitl_outbox_backlog", "Node commands queued and not yet started", value=s.backlog)
        for name, doc, value in (
            (
                "hitl_oldest_queued_command_age_seconds",
                "Age of the oldest node command not yet started",
                s.oldest_queued_age_s,
            ),
            (
                "hitl_oldest_pause_age_seconds",
                "Age of the oldest waiting pause (page reviewers on this)",
                s.oldest_pause_age_s,
            ),
            (
                "hitl_oldest_running_node_age_seconds",
                "Time since the oldest running node started",
                s.oldest_running_age_s,
            ),
            (
                "hitl_oldest_heartbeat_age_seconds",
                "Age of the most lapsed heartbeat of a running node",
                s.oldest_heartbeat_age_s,
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=value)


REDIS_STATE = RedisState()
REGISTRY.register(REDIS_STATE)
SHARED = Shared(LOCAL)
REGISTRY.register(SHARED)


def render() -> bytes:
    return generate_latest(REGISTRY)
