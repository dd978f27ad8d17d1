"""The inspector: no job sits in a live state for ever, and only one inspector acts at a time.

Every live job is waiting on a person, queued in the outbox, running under a live heartbeat,
or being written back (docs/protocol.md § Executors and the outbox). Each sweep, for every
partition whose lease this inspector holds (a Redis lease with a fencing token: however many
replicas run, one acts per partition, and a verdict under a lease that passed to another is
refused by the script):

1. a running node whose heartbeat lapsed (the process doing the work stopped or died) is
   re-dispatched as a new node instance, attempt + 1, after a backoff, or the job ends FAILED
   with ``EXECUTOR_LOST`` after the last attempt. This comes first, so a node whose executor
   was down longer than its deadline (a restart of everything) runs again rather than being
   timed out for the downtime;
2. a running node past its deadline (counted from its start) with a live heartbeat ends the
   job TIMED_OUT (``NODE_DEADLINE_EXCEEDED``).

Queued work has no deadline (a backlog is not a failure; admission control bounds it), and
the two waiting states are never touched: waiting jobs are in neither index.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

from statecore import keys
from statecore.errors import JobNotFound
from statecore.models import CurrentNode, NodeReport
from statecore.store import Store

from . import metrics

log = logging.getLogger("hitl.inspector")

Confirm = Callable[[str, str], Awaitable[bool]]


class Inspector:
    def __init__(
        self,
        store: Store,
        *,
        owner: str | None = None,
        period_s: float = 5.0,
        heartbeat_lapse_s: float = 15.0,
        grace_s: float = 1.0,
        confirm: Confirm | None = None,
        consumer: str | None = None,
        consumer_idle_ms: int = 3_600_000,
    ) -> None:
        self.store = store
        self.owner = owner or consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.lease_ttl_ms = int(max(3 * period_s, 1.0) * 1000)
        self.heartbeat_lapse_s = heartbeat_lapse_s
        self.grace_s = grace_s
        self.confirm = confirm  # "is that node instance still running here?" asked before a re-dispatch
        self.consumer = consumer
        self.consumer_idle_ms = consumer_idle_ms

    async def sweep(self) -> dict[str, int]:
        """One pass over the partitions this inspector holds; returns counts."""
        counts = {"partitions": 0, "lost": 0, "timed_out": 0, "moved_on": 0, "fenced": 0, "confirmed": 0}
        now_ms = int(time.time() * 1000)
        for p in range(keys.PARTITIONS):
            lease = await self.store.acquire_lease(p, self.owner, self.lease_ttl_ms)
            if lease is None:
                continue
            counts["partitions"] += 1
            lapse_before = now_ms - int(self.heartbeat_lapse_s * 1000)
            for job_id in await self.store.lapsed_heartbeats(p, lapse_before):
                await self._lost(job_id, lease, counts)
            for job_id in await self.store.past_deadline(p, now_ms - int(self.grace_s * 1000)):
                await self._overdue(job_id, lease, counts)
        return counts

    async def _running_node(self, job_id: str, counts: dict[str, int]) -> CurrentNode | None:
        """The job's node if it is still running (the index may be a step behind the job)."""
        try:
            node = (await self.store.get(job_id)).current_node
        except JobNotFound:
            return None
        if node is None or node.status != "RUNNING":
            counts["moved_on"] += 1
            return None
        return node

    async def _lost(self, job_id: str, lease: str, counts: dict[str, int]) -> None:
        node = await self._running_node(job_id, counts)
        if node is None:
            return
        nid = node.node_instance_id
        if self.confirm is not None and await self.confirm(job_id, nid):
            counts["confirmed"] += 1  # alive but its heartbeats are late: renew, look again later
            await self.store.heartbeat(job_id, nid)
            return
        result = await self.store.node_lost(job_id, nid, lease=lease)
        counts[{"OK": "lost", "FENCED": "fenced"}.get(result, "moved_on")] += 1
        if result == "OK":
            metrics.INSPECTOR_LOST.labels(node.node_type.value).inc()
            log.warning(
                "%s job=%s node=%s attempt %d: heartbeat lapsed (> %.0fs); re-dispatched or failed",
                node.node_type.value,
                job_id,
                nid,
                node.attempt,
                self.heartbeat_lapse_s,
            )

    async def _overdue(self, job_id: str, lease: str, counts: dict[str, int]) -> None:
        node = await self._running_node(job_id, counts)
        if node is None:
            return
        verdict = NodeReport(
            node_instance_id=node.node_instance_id,
            node_type=node.node_type,
            job_id=job_id,
            outcome="TIMED_OUT",
            error_code="NODE_DEADLINE_EXCEEDED",
            error_message=f"{node.node_type.value} ran past its deadline {node.deadline_at} (attempt {node.attempt})",
        )
        result = await self.store.apply_report(verdict, lease=lease)
        counts[{"OK": "timed_out", "FENCED": "fenced"}.get(result, "moved_on")] += 1
        if result == "OK":
            metrics.INSPECTOR_TIMEOUTS.labels(node.node_type.value).inc()
            log.warning(
                "timed out %s job=%s node=%s after its deadline", node.node_type.value, job_id, node.node_instance_id
            )

    async def housekeeping(self) -> dict[str, int]:
        """Keep what has no TTL bounded: the listing index past retention, and the outbox consumer
        names that dispatchers of earlier processes left behind (each restart adds one per stream)."""
        counts = {"index_pruned": await self.store.prune_expired(), "consumers_deleted": 0}
        if self.consumer is not None:
            counts["consumers_deleted"] = await self.store.prune_consumers(self.consumer, self.consumer_idle_ms)
        if any(counts.values()):
            log.info("housekeeping: %s", counts)
        return counts
