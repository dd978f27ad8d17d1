"""Prometheus metrics, all prefixed ``hitl_``. One registry per process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

JOBS_CREATED = Counter("hitl_jobs_created_total", "Jobs accepted by POST /jobs (replays excluded)", registry=REGISTRY)
JOBS_BY_STATUS = Gauge("hitl_jobs", "Jobs currently known, by status", ["status"], registry=REGISTRY)
INTERVENTIONS = Counter(
    "hitl_interventions_total", "Intervention requests by outcome code", ["outcome"], registry=REGISTRY
)
PAUSE_AGE = Gauge("hitl_oldest_pause_age_seconds", "Age of the oldest waiting pause (alert on this)", registry=REGISTRY)
OUTBOX_LAG = Gauge("hitl_outbox_pending", "Outbox commands not yet acknowledged by a dispatcher", registry=REGISTRY)
NODE_SECONDS = Histogram(
    "hitl_node_duration_seconds",
    "Model node run time by node type and outcome",
    ["node_type", "outcome"],
    registry=REGISTRY,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
REPORTS = Counter(
    "hitl_reports_total", "Node reports by result (OK, DUPLICATE, IGNORED)", ["result"], registry=REGISTRY
)
INSPECTOR_TIMEOUTS = Counter(
    "hitl_inspector_timeouts_total",
    "Nodes timed out by the inspector after their deadline",
    ["node_type"],
    registry=REGISTRY,
)
INSPECTOR_LOST = Counter(
    "hitl_inspector_lost_total",
    "Running nodes whose heartbeat lapsed, re-dispatched (or failed after their last attempt) by the inspector",
    ["node_type"],
    registry=REGISTRY,
)
EMBEDDING_CACHE = Gauge(
    "hitl_embedding_cache",
    "SAM image-embedding cache counters per model deployment "
    "(memory_hits, store_hits, misses, encoder_forwards; as reported by one replica)",
    ["deployment", "kind"],
    registry=REGISTRY,
)
SSE_STREAMS = Gauge("hitl_sse_streams", "Open SSE streams in this process", registry=REGISTRY)
HTTP_SECONDS = Histogram(
    "hitl_http_request_duration_seconds",
    "HTTP request latency by route and status",
    ["route", "status"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)


def render() -> bytes:
    return generate_latest(REGISTRY)
