"""The terminal-state inspector (no job may sit in a live state forever).

Model work has a deadline, set when its command enters the outbox (``node_timeout_s``);
the running index holds it. A sweep times out every node still queued or running past
its deadline by applying a TIMED_OUT report for it, through the same at-most-once
script as any report, so several inspectors (one per dispatcher) never double-apply
and a late model report is recorded as ignored. Waiting for a reviewer has no deadline:
waiting jobs are not in the running index and are never touched; their age is exposed
as a metric for alerts instead.
"""

from __future__ import annotations

import logging
import time

from statecore.models import NodeReport
from statecore.store import Store

from . import metrics

log = logging.getLogger("hitl.inspector")


class Inspector:
    def __init__(
        self, store: Store, grace_s: float = 5.0, *, consumer: str | None = None, consumer_idle_ms: int = 3_600_000
    ) -> None:
        self.store = store
        self.grace_s = grace_s
        self.consumer = consumer
        self.consumer_idle_ms = consumer_idle_ms

    async def housekeeping(self) -> dict[str, int]:
        """Keep what has no TTL bounded: the listing index past retention, and the outbox consumer
        names that dispatchers of earlier processes left behind (each restart adds one per stream)."""
        counts = {"index_pruned": await self.store.prune_expired(), "consumers_deleted": 0}
        if self.consumer is not None:
            counts["consumers_deleted"] = await self.store.prune_consumers(self.consumer, self.consumer_idle_ms)
        if any(counts.values()):
            log.info("housekeeping: %s", counts)
        return counts

    async def sweep(self) -> dict[str, int]:
        """One pass; returns counts (overdue seen, timed out, already moved on)."""
        now_ms = int((time.time() - self.grace_s) * 1000)
        counts = {"overdue": 0, "timed_out": 0, "moved_on": 0}
        for job_id in await self.store.overdue_nodes(now_ms):
            counts["overdue"] += 1
            try:
                state = await self.store.get(job_id)
            except Exception:
                continue
            node = state.current_node
            if node is None or node.status not in ("QUEUED", "RUNNING"):
                counts["moved_on"] += 1
                continue
            result = await self.store.apply_report(
                NodeReport(
                    node_instance_id=node.node_instance_id,
                    node_type=node.node_type,
                    job_id=job_id,
                    outcome="TIMED_OUT",
                    error_code="NODE_DEADLINE_EXCEEDED",
                    error_message=f"{node.node_type} passed its deadline (attempt {node.attempt})",
                ),
                by_inspector=True,
            )
            if result == "OK":
                counts["timed_out"] += 1
                metrics.INSPECTOR_TIMEOUTS.labels(node.node_type).inc()
                log.warning(
                    "timed out %s job=%s node=%s after its deadline", node.node_type, job_id, node.node_instance_id
                )
            else:
                counts["moved_on"] += 1
        return counts
