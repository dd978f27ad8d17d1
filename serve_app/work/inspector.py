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

Every time is read on Redis's clock (``Store.server_ms``), the one heartbeats and deadlines are
written on, and each verdict re-checks the lapse or the deadline inside the script that acts
(a node that beat or started since the index was read is left alone). A node whose result waits
in a write-back spool (its ``writeback`` marker) is left alone, and after Redis was unreachable
no verdict is given for one lapse period: every heartbeat looks old after an outage, and the
spools need a moment to hand their results over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

from hitl_review.statecore import keys
from hitl_review.statecore.errors import JobNotFound
from hitl_review.statecore.models import CurrentNode, NodeReport
from hitl_review.statecore.store import Store

from ..observability import metrics

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
        self._held: dict[int, tuple[str, float]] = {}
        self._store_lost = False  # Redis was unreachable since the last sweep that completed
        self._store_back_at = float("-inf")  # monotonic time Redis answered again after an outage

    def store_unreachable(self) -> None:
        """Redis did not answer (a sweep, or the dispatcher's loop): see the module's docstring."""
        self._store_lost = True

    @property
    def _recovering(self) -> bool:
        return time.monotonic() - self._store_back_at < self.heartbeat_lapse_s

    async def sweep(self) -> dict[str, int]:
        """One pass over the partitions this inspector holds; returns counts."""
        counts = {"partitions": 0, "lost": 0, "timed_out": 0, "moved_on": 0, "fenced": 0, "confirmed": 0}
        counts["writeback"] = counts["recovering"] = 0
        try:
            await self.store.ping()
        except Exception:
            self.store_unreachable()
            raise
        if self._store_lost:
            self._store_lost = False
            self._store_back_at = time.monotonic()
            log.warning("Redis answers again: no verdicts for %.0fs (one heartbeat lapse)", self.heartbeat_lapse_s)
        self._held = {}  # partition -> (lease value, when taken) for this sweep
        lapsed: list[tuple[int, str]] = []  # (partition, index member: keys.split_member)
        overdue: list[tuple[int, str]] = []
        lapse_ms, grace_ms = int(self.heartbeat_lapse_s * 1000), int(self.grace_s * 1000)
        # every partition's lease and both indexes in a few pipelined round trips (Store.sweep_read)
        for p, held, late, over in await self.store.sweep_read(self.owner, self.lease_ttl_ms, lapse_ms, grace_ms):
            counts["partitions"] += 1
            self._held[p] = (held, time.monotonic())
            lapsed += [(p, m) for m in late]
            overdue += [(p, m) for m in over]
        if self._recovering:
            counts["recovering"] = len(lapsed) + len(overdue)
            return counts
        await self._lost(await self._running(lapsed, counts), counts)
        for p, job_id, node in await self._running(overdue, counts):
            lease = await self._lease(p)
            if lease is None:
                continue  # the partition passed to another inspector meanwhile
            await self._overdue(job_id, node, lease, counts)
        return counts

    def held(self) -> list[int]:
        """The partitions whose lease this inspector held in its last sweep."""
        return sorted(self._held)

    async def _lease(self, p: int) -> str | None:
        """The lease of partition ``p``, renewed when a third of its time has gone (a confirmation
        waits seconds for an answer: the verdict after it must not carry a lapsed lease)."""
        held = self._held.get(p)
        if held is not None and time.monotonic() - held[1] < self.lease_ttl_ms / 3000:
            return held[0]
        lease = await self.store.acquire_lease(p, self.owner, self.lease_ttl_ms)
        if lease is None:
            self._held.pop(p, None)
            return None
        self._held[p] = (lease, time.monotonic())
        return lease

    async def _running(
        self, members: list[tuple[int, str]], counts: dict[str, int]
    ) -> list[tuple[int, str, CurrentNode]]:
        """The nodes these index members name that still run (an index may be a step behind the
        job) and whose result does not wait in a write-back spool: (partition, job id, node)."""
        found: list[tuple[int, str, CurrentNode]] = []
        for p, member in members:
            job_id, nid = keys.split_member(member)
            try:
                state = await self.store.get(job_id)
            except JobNotFound:
                continue
            node = state.subject_nodes.get(nid) if nid else state.current_node
            if node is None or node.status != "RUNNING":
                counts["moved_on"] += 1
                continue
            found.append((p, job_id, node))
        pending = await self.store.writebacks_pending([(j, n.node_instance_id) for _, j, n in found])
        counts["writeback"] += len(pending)
        return [f for f in found if (f[1], f[2].node_instance_id) not in pending]

    async def _confirmed(self, nodes: list[tuple[int, str, CurrentNode]]) -> list[bool]:
        """Ask every lapsed node's executor at once (each answer may take its whole timeout)."""
        if self.confirm is None or not nodes:
            return [False] * len(nodes)
        confirm = self.confirm
        gate = asyncio.Semaphore(64)

        async def ask(job_id: str, nid: str) -> bool:
            async with gate:
                return await confirm(job_id, nid)

        return list(await asyncio.gather(*(ask(j, n.node_instance_id) for _, j, n in nodes)))

    async def _lost(self, nodes: list[tuple[int, str, CurrentNode]], counts: dict[str, int]) -> None:
        alive = await self._confirmed(nodes)
        for (p, job_id, node), confirmed in zip(nodes, alive, strict=True):
            nid = node.node_instance_id
            if confirmed:
                counts["confirmed"] += 1  # alive but its heartbeats are late: renew, look again later
                await self.store.heartbeat(job_id, nid)
                continue
            lease = await self._lease(p)
            if lease is None:
                continue  # the partition passed to another inspector while we asked
            lapse_ms = int(self.heartbeat_lapse_s * 1000)
            result = await self.store.node_lost(
                job_id, nid, lease=lease, lapse_ms=lapse_ms, actor=f"inspector:{self.owner}"
            )
            counts[{"OK": "lost", "FENCED": "fenced", "ALIVE": "confirmed"}.get(result, "moved_on")] += 1
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

    async def _overdue(self, job_id: str, node: CurrentNode, lease: str, counts: dict[str, int]) -> None:
        verdict = NodeReport(
            node_instance_id=node.node_instance_id,
            node_type=node.node_type,
            job_id=job_id,
            outcome="TIMED_OUT",
            error_code="NODE_DEADLINE_EXCEEDED",
            error_message=f"{node.node_type.value} ran past its deadline {node.deadline_at} (attempt {node.attempt})",
        )
        result = await self.store.apply_report(
            verdict, lease=lease, actor=f"inspector:{self.owner}", recheck=f"deadline:{int(self.grace_s * 1000)}"
        )
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
