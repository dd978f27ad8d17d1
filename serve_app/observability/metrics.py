"""Prometheus metrics, all prefixed ``hitl_``.

Three kinds. Two are the same on every replica, so scrapes through a load balancer agree: figures
read from Redis at each scrape (``RedisState``, ``hitl_outbox_pending``); counters and histograms each
process increments in ``LOCAL`` and adds up in Redis (:mod:`serve_app.observability.shared_metrics`,
rendered from there); aggregate those across instances with ``max()``, never ``sum()``. The third,
figures of this process alone (:mod:`serve_app.observability.process_metrics`), is in ``/metrics``
only where one process answers every scrape; under Ray Serve it goes per replica through Ray's metrics port."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hitl_review.statecore import counters, keys, watchers, webhooks
from hitl_review.statecore.counters import STATUSES, Coverage, Snapshot

from .policy_metrics import POLICY_STATE
from .process_metrics import (  # noqa: F401  # re-exported: where the dispatcher, capacity and store_reset count
    DISPATCH_CALLS,
    DISPATCH_LIMIT,
    EMBEDDING_CACHE,
    PROCESS,
    STORE_RESETS,
    WRITEBACK_SPOOLED,
)
from .shared_metrics import Shared

REGISTRY = CollectorRegistry(auto_describe=True)  # what /metrics renders
LOCAL = CollectorRegistry(auto_describe=True)  # this process's counters and histograms: rendered via Redis

JOBS_CREATED = Counter("hitl_jobs_created_total", "Jobs accepted by POST /jobs (replays excluded)", registry=LOCAL)
INTERVENTIONS = Counter(
    "hitl_interventions_total", "Intervention requests by outcome code", ["outcome"], registry=LOCAL
)
OUTBOX_LAG = Gauge(
    "hitl_outbox_pending",
    "Outbox commands not yet acknowledged by a dispatcher (from Redis, at each scrape: the same on every replica)",
    registry=REGISTRY,
)
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
JOBS_RESTORED = Counter(
    "hitl_jobs_restored_total",
    "Live jobs Redis had lost, given back from the archive's live mirror without an admin, by how they were "
    "found (read: a request asked for one; sweep: the archiver's mirror pass) and outcome",
    ["how", "outcome"],
    registry=LOCAL,
)
MIRROR_FAILURES = Counter(
    "hitl_mirror_write_failures_total",
    "Writes to the archive that failed and will be retried, by path: archive (a finished job's copy), mirror "
    "(the periodic live mirror), journal (--durability strict: a change's mirror row before its answer, a 503)",
    ["path"],
    registry=LOCAL,
)
MIRROR_PASSES = Counter(
    "hitl_mirror_passes_total", "Live mirror passes completed by the archivers (every inspector period)", registry=LOCAL
)
MIRROR_LAG = Histogram(
    "hitl_mirror_lag_seconds",
    "How long a change of a live job waited for the periodic live mirror (from the job's updated_at to its row "
    "written): what --durability fast can lose when Redis comes back empty",
    registry=LOCAL,
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)
JOURNAL_SECONDS = Histogram(
    "hitl_journal_seconds",
    "--durability strict: the time a change waits for its live mirror row before it is answered",
    registry=LOCAL,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)
ACCOUNTS_RESTORED = Counter(
    "hitl_accounts_restored_total",
    "Reviewer accounts Redis had lost (its accounts hash gone), written back from the archive's copy",
    registry=LOCAL,
)
WEBHOOK_DELIVERIES = Counter(
    "hitl_webhook_deliveries_total",
    "Webhook delivery attempts by outcome: delivered (2xx), failed (retried after a backoff), gave_up",
    ["outcome"],
    registry=LOCAL,
)
WEBHOOK_PENDING = Gauge(
    "hitl_webhook_pending", "Webhook deliveries queued or being retried (from Redis, at each scrape)", registry=REGISTRY
)


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


# ---------------------------------------------------------------------------- refreshed from Redis
# Stuck-job figures (seed 002) and the settled coverage the coverage alert reads, computed from
# Redis at each scrape by ``refresh_stuck`` (called by the /metrics route after ``counters.read``).
# The same on every API replica: aggregate with max(), never sum().

STALE_AFTER_S = 3600.0  # a running node not heard from for this long is stale
SETTLE_S = 900.0  # the settled coverage leaves out the jobs submitted in the last 15 minutes


@dataclass(frozen=True)
class StuckFigures:
    running: int  # nodes RUNNING now (the running index)
    mean_running_age_s: float  # their mean time since start; 0 when none runs
    stale_running: int  # of them, those whose last heartbeat (or start, without one) is over STALE_AFTER_S old
    settled: Coverage  # the coverage window without its last min(SETTLE_S, window / 2)

    @property
    def stale_ratio(self) -> float:
        return self.stale_running / self.running if self.running else 0.0


def _started_s(raw: str | None) -> float | None:
    started = json.loads(raw).get("started_at") if raw else None
    return datetime.fromisoformat(started).timestamp() if started else None


async def read_stuck(r: Any, window_s: float = 3600.0, now_ms: int | None = None) -> StuckFigures:
    """Two rounds: per partition the running and heartbeat indexes (a pipeline) beside the settled
    window's coverage sums (``counters.window_sums``, four numbers a partition), then the start of every
    running node (O(running nodes), which the deployments' capacity and the deadlines bound; never
    O(stored jobs))."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    minutes = counters.window_minutes(window_s, now_ms)
    settle_min = int(min(SETTLE_S, window_s / 2) // 60)
    settled = minutes[: len(minutes) - settle_min] if settle_min else minutes
    async with r.pipeline(transaction=False) as pipe:
        for p in range(keys.PARTITIONS):
            pipe.zrange(keys.running(p), 0, -1)
            pipe.zrange(keys.heartbeats(p), 0, -1, withscores=True)
        res, sums = await asyncio.gather(pipe.execute(), counters.window_sums(r, settled[0], settled[-1]))
    running: list[str] = []
    beats: dict[str, float] = {}
    for i in range(0, len(res), 2):
        running.extend(res[i])
        beats.update((job_id, score / 1000) for job_id, score in res[i + 1])
    now_s = now_ms / 1000
    ages: list[float] = []
    stale = 0
    if running:
        async with r.pipeline(transaction=False) as pipe:
            for job_id in running:
                pipe.hget(*keys.node_location(job_id))
            nodes = await pipe.execute()
        for job_id, raw in zip(running, nodes, strict=True):
            started = _started_s(raw)
            if started is not None:
                ages.append(max(0.0, now_s - started))
            last_sign = beats.get(job_id, started)
            stale += last_sign is None or now_s - last_sign > STALE_AFTER_S
    coverage = Coverage(len(settled) * 60.0, sums["sub"], sums["term"], sums["wait"], sums["ucan"])
    return StuckFigures(len(running), sum(ages) / len(ages) if ages else 0.0, stale, coverage)


class StuckState(Collector):
    """The figures of the last ``refresh_stuck``; absent until one succeeded."""

    def __init__(self) -> None:
        self.figures: StuckFigures | None = None
        self.watch: watchers.Watch | None = None  # who follows which job (statecore.watchers)

    def collect(self) -> Iterator[Metric]:
        w = self.watch
        if w is not None:
            yield GaugeMetricFamily(
                "hitl_sse_streams", "SSE streams open on every event server of the deployment", value=w.streams
            )
            yield GaugeMetricFamily(
                "hitl_waiting_unwatched",
                "Jobs waiting on a person whose events nobody follows (no SSE stream for 30 s)",
                value=w.waiting_unwatched,
            )
            yield GaugeMetricFamily(
                "hitl_oldest_unwatched_pause_age_seconds",
                "Age of the oldest waiting pause nobody watches (0 when none): page on this, not on age alone",
                value=w.oldest_unwatched_pause_age_s,
            )
        f = self.figures
        if f is None:
            return
        yield GaugeMetricFamily("hitl_running_nodes", "Nodes RUNNING now (from Redis)", value=f.running)
        yield GaugeMetricFamily(
            "hitl_running_node_mean_age_seconds",
            "Mean time since start of the RUNNING nodes (0 when none)",
            value=f.mean_running_age_s,
        )
        yield GaugeMetricFamily(
            "hitl_running_nodes_stale_ratio",
            "Share of the RUNNING nodes not heard from (heartbeat, or start without one) for over an hour",
            value=f.stale_ratio,
        )
        yield GaugeMetricFamily(
            "hitl_terminal_coverage_settled_ratio",
            "hitl_terminal_coverage_ratio over the jobs submitted in the coverage window at least "
            "min(15 min, window / 2) ago: work in flight in a healthy burst does not lower it, a stuck job does",
            value=f.settled.ratio,
        )


STUCK_STATE = StuckState()
REGISTRY.register(STUCK_STATE)
REGISTRY.register(POLICY_STATE)  # the box auto-approve policy (serve_app.observability.policy_metrics)


async def refresh_stuck(r: Any, window_s: float) -> None:
    STUCK_STATE.figures, STUCK_STATE.watch, _ = await asyncio.gather(
        read_stuck(r, window_s), watchers.read(r), POLICY_STATE.refresh(r)
    )


async def refresh_from_store(store: Any, window_s: float) -> None:
    """Every series ``/metrics`` reads from Redis (``store``: a ``statecore.store.Store``), the reads side by
    side: they are independent, so Redis works on one while this process parses another's replies (one after
    the other, a scrape at 300,000 waiting jobs took 69 ms, the sum of both). The counters' series read as
    down (``REDIS_STATE`` empty) when a read fails; the first failure is raised."""
    REDIS_STATE.update(None)  # down until this scrape's read succeeds
    got = await asyncio.gather(
        counters.read(store.r, window_s),
        refresh_stuck(store.r, window_s),
        store.outbox_pending(),
        webhooks.pending(store.r),
        SHARED.flush(store.r),  # this replica's increments, then (below) everyone's totals
        return_exceptions=True,
    )
    for outcome in got:
        if isinstance(outcome, BaseException):
            raise outcome
    snap, _, outbox, hooks, _ = got
    REDIS_STATE.update(cast(Snapshot, snap))
    OUTBOX_LAG.set(cast(int, outbox))
    WEBHOOK_PENDING.set(cast(int, hooks))
    await SHARED.refresh(store.r)


SHARED = Shared(LOCAL)
REGISTRY.register(SHARED)


def render(per_process: bool = True) -> bytes:
    """The scrape; ``per_process``: with this process's own series (``PROCESS``), only where one
    process answers every scrape (plain uvicorn, one Api replica): each Ray Api replica also exports them
    through Ray's metrics port (``process_metrics.RayExport``)."""
    text = generate_latest(REGISTRY)
    return text + generate_latest(PROCESS) if per_process else text
