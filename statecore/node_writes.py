"""The store's writes of a node's lifecycle: started by its executor, reported, lost, failed, given
up on (docs/protocol.md § Executors and the outbox). A mixin of :class:`statecore.store.Store`.

Each one reads the job, asks the decider (``statecore.reports``) for a plan on Redis's clock and
commits it through ``apply_report.lua``, which applies a node's report at most once and only while
that node is the job's current node of a live job.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from . import auto_plan, auto_store, decide, errors, keys
from .audit import Intent
from .ids import now_iso
from .models import NodeCommand, NodeReport
from .states import NodeType

log = logging.getLogger("hitl.store")

# The subjects of one job are cut side by side (statecore.subjects): their nodes' starts and reports race
# for the job's version, as many at once as the Segmenter has slots. A write that finds the job changed
# under it (STALE) plans again on the job as it now is, after a random wait that grows with its tries, so
# the racers spread out instead of colliding again in lockstep; every one lands, in some order.
STALE_RETRIES = 200
STALE_WAIT_S = 0.001  # the first retry waits up to this; each next one up to twice as long ...
STALE_WAIT_MAX_S = 0.05  # ... up to this


async def wait_after_stale(attempt: int) -> None:
    """Before try ``attempt`` (0: the first, no wait) of a write that found the job changed under it."""
    if attempt:
        await asyncio.sleep(random.uniform(0, min(STALE_WAIT_MAX_S, STALE_WAIT_S * 2 ** min(attempt, 8))))


class NodeWritesMixin:
    config: Any
    r: Any
    cluster: bool
    _scripts: dict[str, Any]
    _meta: Any  # Store._meta
    _keys: Any  # Store._keys
    _args: Any  # Store._args
    server_ms: Any  # LifecycleMixin.server_ms
    _subject_write: Any  # SubjectWritesMixin._subject_write
    stale_answers = 0  # writes that found the job changed under them and planned again (tests, benchmarks)

    async def _meta_and_clock(self, job_id: str) -> tuple[dict[str, str], int]:
        """The job's meta and the Redis server's clock (ms) in one pipelined round trip."""
        jk = keys.job(job_id)
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.hgetall(jk.meta)
            if self.cluster:  # the clock of the master holding the job, as server_ms reads it
                pipe.eval("return redis.call('TIME')", 1, jk.meta)
            else:
                pipe.time()
            meta, t = await pipe.execute()
        if not meta:  # a job the store may restore (Store.on_missing): as Store._meta reads it
            meta = await self._meta(job_id)
        return meta, int(t[0]) * 1000 + int(t[1]) // 1000

    async def node_started(self, cmd: NodeCommand, *, actor: str = "executor") -> str:
        """Start the queued node: see :meth:`node_started_by`."""
        return await self.node_started_by(cmd.job_id, cmd.node_instance_id, cmd.node_type, actor=actor)

    async def node_started_by(
        self, job_id: str, nid: str, node_type: str, *, max_execution_s: float | None = None, actor: str = "executor"
    ) -> str:
        """The process doing the node's work has begun it (statecore.execution): RUNNING, attempt
        + 1, a first heartbeat, and its deadline from now on Redis's clock (``max_execution_s``:
        the node type's maximum execution time, the store's own setting when None). ``OK`` to run
        it; ``BUSY`` when it is already running (a reclaimed command whose first holder is still
        at work: a long node is never started twice); ``IGNORED``/``DUPLICATE`` when it is no
        longer current (skip it)."""
        return await self._report(job_id, nid, node_type, kind="started", actor=actor, max_execution_s=max_execution_s)

    async def apply_report(
        self,
        report: NodeReport,
        *,
        lease: str | None = None,
        actor: str = "dispatcher",
        action: str = "",
        recheck: str = "",
    ) -> str:
        """Apply a node's result at most once: ``OK``, ``DUPLICATE``, ``IGNORED`` (or ``FENCED``).

        ``lease``: the report is the inspector's verdict that the node passed its deadline, given
        under its lease of the job's partition. It is recorded apart from the model's own report,
        so when the model answers after all, its report is ``IGNORED`` with a ``REPORT_IGNORED``
        event (reason ``NODE_TIMED_OUT``), and only a replay of either report is a silent
        ``DUPLICATE``. A verdict under a lease that has passed to another inspector is ``FENCED``.
        ``actor`` and ``action`` (default NODE_REPORT, or NODE_TIMED_OUT under a lease): what the
        audit entry names (docs/protocol.md § Audit). ``recheck``: what the script checks again on
        Redis's clock before an inspector's verdict acts (apply_report.lua ARGV[13])."""
        act = action or ("NODE_TIMED_OUT" if lease is not None else "NODE_REPORT")
        nid = report.node_instance_id
        return await self._report(
            report.job_id,
            nid,
            report.node_type,
            kind="report",
            report=report,
            lease=lease,
            actor=actor,
            action=act,
            recheck=recheck,
        )

    async def node_lost(
        self,
        job_id: str,
        node_instance_id: str,
        *,
        lease: str,
        lapse_ms: int | None = None,
        reason: str = "EXECUTOR_LOST",
        actor: str = "inspector",
    ) -> str:
        """The inspector's verdict on a running node whose heartbeat lapsed: re-dispatch it as a new
        node instance after a backoff, or end the job FAILED after ``max_attempts`` starts. The
        lapse (no heartbeat for ``lapse_ms`` on Redis's clock) is checked again inside the script
        that acts (when ``lapse_ms`` is given): a node that beat or started meanwhile is ``ALIVE``
        and left alone."""
        return await self._report(
            job_id,
            node_instance_id,
            "",
            kind="lost",
            lease=lease,
            reason=reason,
            actor=actor,
            action="NODE_LOST",
            recheck="" if lapse_ms is None else f"lapse:{lapse_ms}",
        )

    async def node_dead_lettered(self, job_id: str, node_instance_id: str, *, reason: str, actor: str) -> str:
        """A node command given up on (delivered more than ``--max-deliveries`` times) ends its
        job FAILED with ``reason``, visibly (NODE_FAILED), whether the node was queued or running:
        a dead letter never leaves a job live for ever. ``MOVED_ON`` when it is no longer current."""
        return await self._report(
            job_id, node_instance_id, "", kind="dead", reason=reason, actor=actor, action="NODE_DEAD_LETTERED"
        )

    async def node_failed(self, job_id: str, node_instance_id: str, *, reason: str, actor: str = "dispatcher") -> str:
        """A dispatcher's attempt failed with a transient error (the replica crashed, the network
        failed): re-dispatch the node as a new instance after a backoff, or end the job FAILED
        with ``reason`` after ``max_attempts`` starts. Each attempt stays visible in the events."""
        return await self._report(
            job_id, node_instance_id, "", kind="lost", reason=reason, actor=actor, action="NODE_ATTEMPT_FAILED"
        )

    async def _report(
        self,
        job_id: str,
        nid: str,
        node_type: str,
        *,
        kind: str,
        report: NodeReport | None = None,
        lease: str | None = None,
        reason: str = "EXECUTOR_LOST",
        actor: str = "dispatcher",
        action: str = "NODE_STARTED",
        max_execution_s: float | None = None,
        recheck: str = "",
    ) -> str:
        subject = node_type in ("", NodeType.SEGMENT_SUBJECT.value)
        if subject and kind in ("started", "report") and lease is None and not recheck:  # its own fields alone
            own = await self._subject_write(
                job_id,
                nid,
                node_type,
                report=report,
                max_execution_s=max_execution_s,
                actor=actor,
                action=action,
            )
            if own is not None:
                return str(own)
        jk = keys.job(job_id)
        for attempt in range(STALE_RETRIES):
            await wait_after_stale(attempt)
            # Deadlines, backoffs and heartbeats are all read on one clock: the Redis server's, read
            # with the job in one round trip (on a cluster on the job's own master).
            meta, now_ms = await self._meta_and_clock(job_id)
            if not meta:
                return "IGNORED"  # finished and expired long ago
            state = decide.JobState.from_meta(meta)
            now = now_iso(now_ms / 1000)
            node = state.live_node(nid)  # the job's current node, or one of its subject nodes
            # A node whose result was already applied stays current (COMPLETED/FAILED/TIMED_OUT) until
            # the next one; its redelivered report must not be planned again (the job has moved on, so
            # the move could be illegal): the script answers DUPLICATE from the reports set.
            live = node is not None and meta.get("terminal") != "1"
            status = node.status if node is not None else ""
            plan_json = ""
            by_policy: tuple[str, str] = ("", "")  # an auto-approval's (policy, snapshot id): its audit entry
            if kind == "started":
                if live and status == "RUNNING":
                    return "BUSY"
                if live and status in ("QUEUED", "RETRY_WAIT"):
                    max_s = max_execution_s or self.config.max_execution_s(node.node_type.value)  # type: ignore[union-attr]  # live
                    plan_json = decide.plan_node_started(state, nid, now, now_ms, max_s).to_json(
                        now, self.config.archive
                    )
            elif kind == "lost":
                if not live or status != "RUNNING":
                    return "MOVED_ON"
                node_type = node.node_type.value  # type: ignore[union-attr]  # live: there is a node
                plan = decide.plan_node_lost(
                    state,
                    nid,
                    now,
                    now_ms,
                    reason=reason,
                    max_attempts=self.config.max_attempts,
                    backoff_s=self.config.retry_backoff_s,
                )
                plan_json = plan.to_json(now, self.config.archive)
            elif kind == "dead":
                if not live or status not in ("QUEUED", "RETRY_WAIT", "RUNNING"):
                    return "MOVED_ON"
                node_type = node.node_type.value  # type: ignore[union-attr]  # live: there is a node
                plan_json = decide.plan_node_dead(state, nid, reason=reason, now=now, now_ms=now_ms).to_json(
                    now, self.config.archive
                )
            elif live and status in ("QUEUED", "RETRY_WAIT", "RUNNING"):
                assert report is not None
                detected = report.node_type == "DETECT_SUBJECTS" and report.outcome == "SUCCEEDED"
                auto = await auto_store.ask(self) if detected else None  # the box policy's say, if any
                planned = decide.plan_report(
                    state, report, now, now_ms, workflow=self.config.workflow_version, auto=auto
                )
                plan_json = planned.to_json(now, self.config.archive)
                by_policy = auto_plan.audit_of(planned)
            by_inspector = lease is not None
            res = await self._scripts["apply_report"](
                keys=self._keys(state, jk),
                args=self._args(job_id, now, actor, Intent(node=f"{node_type}:{nid}" if node_type else nid))
                + [
                    nid,
                    str(state.version),
                    plan_json,
                    "0" if kind == "started" else "1",
                    node_type,
                    "1" if by_inspector else "0",
                    lease or "",
                    action,
                    recheck,
                    *by_policy,
                ],
            )
            if res[0] == "STALE":
                self.stale_answers += 1
                continue
            if res[0] == "JOB_NOT_FOUND":
                return "IGNORED"
            if res[0] == "IGNORED":
                log.info("report ignored job=%s node=%s reason=%s", job_id, nid, res[1])
            return str(res[0])
        raise errors.StaleRead("the job kept changing while applying a report", job_id=job_id)
