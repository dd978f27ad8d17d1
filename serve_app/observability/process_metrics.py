"""Figures of one process alone: its write-back spool, its dispatcher's calls and limit, the store
resets it saw, the embedding caches its own models count (docs/scaling.md § Monitoring).

A load-balanced ``/metrics`` (Serve's proxy over several Api replicas) answers each scrape from
one replica: such a series would alternate between replicas inside one series (a spool of 3, then
0, then 3), so an alert on it may never hold for its ``for:``, and ``increase()`` reads each switch
as a counter reset. So they live in ``PROCESS``, a registry ``/metrics`` renders only where one
process answers every scrape (plain uvicorn, or ``api_replicas`` 1). Under Ray Serve each Api
replica also exports them through Ray's metrics port (``RayExport``: ``ray.serve.metrics``, which
Serve tags with the deployment and replica), as ``ray_hitl_writeback_spooled{replica=…}`` and so on,
and the rules ``sum()``/``max()`` those by replica. The embedding caches are the model replicas' own
Ray series (``ray_hitl_model_embedding_cache_total``, deployments/metrics.py): not exported twice."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from hitl_review.statecore.durable import reraise_if_cancelled

from .reported import ReportedCounter

log = logging.getLogger("hitl.metrics")

PROCESS = CollectorRegistry(auto_describe=True)  # rendered by /metrics only where one process serves everything

STORE_RESETS = Counter(
    "hitl_store_resets_total",
    "Times this process found Redis come back empty (its store identity changed); each writes a report. Kept "
    "per process, not in Redis: the Redis that came back empty would have lost the count",
    registry=PROCESS,
)
DISPATCH_CALLS = Gauge(
    "hitl_dispatcher_calls",
    "Model calls this process's dispatcher has outstanding, per deployment (serve_app.work.capacity)",
    ["deployment"],
    registry=PROCESS,
)
DISPATCH_LIMIT = Gauge(
    "hitl_dispatcher_call_limit",
    "The most calls this process's dispatcher may have outstanding per deployment: running replicas x "
    "max_ongoing_requests (+1 queued per replica), shared among the Api replicas",
    ["deployment"],
    registry=PROCESS,
)
WRITEBACK_SPOOLED = Gauge(
    "hitl_writeback_spooled",
    "Model results in this process's write-back spool that Redis has not taken yet (per process: sum() "
    "them); above 0 while Redis is unreachable, when the Redis-held hitl_writeback_failures_total cannot move",
    registry=PROCESS,
)
# The SAM embedding caches' running totals as this process's models count them (plain uvicorn's
# in-process models); under Ray the model replicas export their own (ray_hitl_model_embedding_cache_total).
EMBEDDING_CACHE = ReportedCounter(
    "hitl_embedding_cache",
    "SAM image-embedding cache lookups and encoder passes per model deployment "
    "(memory_hits, store_hits, misses, encoder_forwards; running totals of this process's models)",
    ["deployment", "kind"],
)
PROCESS.register(EMBEDDING_CACHE)
# Exported under Ray as gauges (Ray prefixes ``ray_``): a counter as its running total in this replica
# (``ray_hitl_store_resets``, 0 from the replica's start: Ray's counters cannot be made at 0, and a
# series born at 1 is one increase() never sees), a gauge as is.
RAY_EXPORTED = {
    "hitl_store_resets": "hitl_store_resets",
    "hitl_dispatcher_calls": "hitl_dispatcher_calls",
    "hitl_dispatcher_call_limit": "hitl_dispatcher_call_limit",
    "hitl_writeback_spooled": "hitl_writeback_spooled",
}
EXPORT_EVERY_S = 5.0  # Ray's metrics agent reports every 10 s or so: a copy this often loses nothing


class RayExport:
    """This process's ``PROCESS`` series copied into ``ray.serve.metrics`` gauges, which Serve tags
    with the deployment, replica and application. ``gauge``: Ray's class (a test's own recorder instead)."""

    def __init__(self, gauge: Callable[..., Any] | None = None) -> None:
        if gauge is None:
            from ray.serve.metrics import Gauge as RayGauge

            gauge = RayGauge
        self._gauge = gauge
        self._made: dict[str, Any] = {}

    def copy(self) -> None:
        for family in PROCESS.collect():
            name = RAY_EXPORTED.get(family.name)
            if name is None:
                continue
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                if name not in self._made:
                    self._made[name] = self._gauge(
                        name,
                        description=family.documentation,
                        tag_keys=tuple(s.labels) or None,  # type: ignore[arg-type]  # Ray annotates tuple[str]; takes any
                    )
                self._made[name].set(s.value, tags=dict(s.labels) or None)

    async def run_forever(self, every_s: float = EXPORT_EVERY_S) -> None:
        while True:
            reraise_if_cancelled(None)  # a cancel swallowed on the way ends the loop
            try:
                self.copy()
            except Exception as e:  # Ray's metrics are best effort: the replica serves on without them
                reraise_if_cancelled(e)
                log.debug("ray metrics export failed: %s", e)
            await asyncio.sleep(every_s)
