"""The effectful half of the state core: reads a job, asks ``decide`` for a plan,
commits it through one Lua script. Async, redis-py with hiredis, one pool.

Every state change follows the same shape: read the job's meta (one HGETALL),
compute the plan purely, run the operation's script with the version the plan
was computed from. The script re-checks the protocol's preconditions atomically and
refuses with ``STALE`` if the job moved in between; the store then re-reads and
re-plans (bounded), so no decision is ever applied to a state it was not made for.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from . import (
    auto_plan,
    auto_store,
    counters,
    decide,
    durable,
    errors,
    gate_spot,
    gates,
    keys,
    listing,
    prelabelled,
    quorum,
    rebase,
    scripts,
)
from .audit import AuditMixin, Intent, actor_arg
from .claims import ClaimsMixin
from .history import HistoryMixin
from .ids import canonical_json, now_iso, payload_hash
from .lifecycle import LifecycleMixin
from .mask_review import GATE_MODES
from .models import (
    QUORUM_POLICIES,
    ClaimView,
    ImageRef,
    InterventionRequest,
    JobComment,
    JobFlag,
    JobSnapshot,
    JobSummary,
)
from .node_writes import STALE_RETRIES as NODE_STALE_RETRIES
from .node_writes import NodeWritesMixin, wait_after_stale
from .nodes import Detection
from .notes import COMMENTS_SHOWN, NotesMixin
from .outbox import OutboxMixin, create_groups
from .plan import CONTINUABLE_WORKFLOW_VERSIONS, WORKFLOW_VERSION
from .states import JobStatus, is_terminal
from .subject_writes import SubjectWritesMixin

log = logging.getLogger("hitl.store")

STALE_RETRIES = 20


@dataclass
class StoreConfig:
    retention_s: int = 7 * 24 * 3600
    node_timeout_s: float = 600.0  # a node's maximum execution time, from its start
    node_timeouts: dict[str, float] = field(default_factory=dict)  # per node type, overriding it
    max_attempts: int = 3  # starts of one node before a lost executor fails the job
    retry_backoff_s: float = 1.0  # before a re-dispatch; doubles per attempt
    claim_ttl_s: float = 60.0  # a review claim not renewed within this expires (docs/protocol.md § Claims)
    archive: bool = False  # finished jobs are archived before their retention starts (docs/protocol.md § Archive)
    # The workflow definition new pauses are opened under, and those whose pauses this store
    # continues (docs/protocol.md § Snapshot echo and the fifth gate): the build's, unless a test says otherwise.
    workflow_version: str = WORKFLOW_VERSION
    continuable_workflow_versions: frozenset[str] = CONTINUABLE_WORKFLOW_VERSIONS
    # Which masks wait for a person (docs/protocol.md § Cut-out quality): review-failing, review-all,
    # or off (the gate only records); recorded in each job's policy when it is created. hitl up
    # passes its --quality-gate (review-failing by default).
    quality_gate: str = "off"
    # The share of masks the gate passed that a person checks all the same, unmarked (statecore.gate_spot;
    # hitl up's --mask-spot-check); recorded in each job's policy under review-failing.
    mask_spot_check: float = 0.0
    mask_spot_salt: Callable[[], str] = gate_spot.new_salt  # each job's secret (seeded in tests)
    # The box auto-approve policy, its configured mode and spot-check share (statecore.auto_store,
    # docs/learning.md): hitl up's --auto-approve, --auto-approve-policy, --spot-check. None: off.
    auto_approve: auto_store.AutoApproveConfig | None = None

    def __post_init__(self) -> None:
        if self.quality_gate not in GATE_MODES:
            raise ValueError(f"quality_gate {self.quality_gate!r} must be one of {list(GATE_MODES)}")
        if not 0 <= self.mask_spot_check <= 1:
            raise ValueError(f"mask_spot_check {self.mask_spot_check} must lie in [0, 1]")
        if self.workflow_version not in self.continuable_workflow_versions:
            # Its own re-offers would be refused again at every submission: never done reviewing.
            raise ValueError(
                f"workflow_version {self.workflow_version!r} must be one of the continuable versions "
                f"{sorted(self.continuable_workflow_versions)}"
            )

    def max_execution_s(self, node_type: str) -> float:
        return self.node_timeouts.get(node_type, self.node_timeout_s)


@dataclass
class Reply:
    """An HTTP-ready answer whose bytes must be replayed identically."""

    status_code: int
    body: str
    replayed: bool
    job_id: str


class Store(
    OutboxMixin, NodeWritesMixin, SubjectWritesMixin, LifecycleMixin, ClaimsMixin, AuditMixin, HistoryMixin, NotesMixin
):
    """The state core's operations on Redis; the outbox, a node's lifecycle writes, the inspector-side
    reads, review claims, the audit log and a job's history are in :mod:`statecore.outbox`,
    :mod:`statecore.node_writes`, :mod:`statecore.lifecycle`,
    :mod:`statecore.claims`, :mod:`statecore.audit` and :mod:`statecore.history`."""

    def __init__(self, client: Any, config: StoreConfig | None = None, *, cluster: bool = False) -> None:
        self.r = client
        self.cluster = cluster
        self.config = config or StoreConfig()
        self.url: str | None = None  # as given to from_url (executors record node starts there)
        self.sync_command: tuple[Any, ...] | None = None  # --durability strict: see statecore.durable
        self.sync_acks = 0
        # Asked when a job is not in Redis: True when it is there again (restored from the archive's
        # live mirror: serve_app.recovery.recovery, docs/protocol.md § Redis outages). None: a miss is a miss.
        self.on_missing: Callable[[str], Awaitable[bool]] | None = None
        # --durability strict with an archive: awaited after each journaled script (statecore.durable.synced),
        # the live mirror's row of the job before the answer returns (archive/journal.py). None: no journal.
        self.journal: Callable[..., Awaitable[None]] | None = None
        self._scripts = {
            name: s if name in scripts.READ_ONLY else durable.synced(self, s, name)
            for name, s in scripts.register(client).items()
        }

    async def journal_behind(self, job_id: str) -> None:
        """Under ``--durability strict`` with an archive: the job's live mirror row, when it holds an
        older version than Redis (an earlier journal failed, or a reader raced the writer between its
        commit and its journal), before the caller answers. No-op without a journal."""
        if self.journal is not None:
            await self.journal(self, job_id, changed=False)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def from_url(
        cls,
        url: str,
        config: StoreConfig | None = None,
        *,
        cluster: bool | None = None,
        max_connections: int = 256,
        timeout_s: float | None = 5.0,
    ) -> Store:
        """``timeout_s``: the operation timeout (statecore.durable.pool_options)."""
        original = url
        if cluster is None:
            cluster = url.startswith("redis+cluster://") or "cluster=true" in url
        url = url.replace("redis+cluster://", "redis://").replace("?cluster=true", "")
        timeouts = durable.pool_options(timeout_s, cluster=cluster)
        client: Any  # redis.asyncio.Redis or RedisCluster: the same command API for what we use
        if cluster:
            client = aioredis.RedisCluster.from_url(
                url, decode_responses=True, max_connections=max_connections, **timeouts
            )
        else:
            # A burst beyond ``max_connections`` waits for a free connection (up to the operation
            # timeout, then 503 STORE_UNAVAILABLE) instead of failing at once with "Too many connections".
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                decode_responses=True,
                max_connections=max_connections,
                timeout=timeout_s,
                health_check_interval=30,
                **timeouts,
            )
            client = aioredis.Redis.from_pool(pool)
        store = cls(client, config, cluster=cluster)
        store.url = original
        return store

    async def close(self) -> None:
        await self.r.aclose()

    async def ping(self) -> bool:
        return bool(await self.r.ping())

    async def ensure_groups(self) -> None:
        """Create the dispatchers' consumer group on every outbox stream (idempotent), then move
        what an earlier version queued for other lanes into their streams (``outbox_sort``)."""
        await create_groups(self.r, keys.all_outboxes(), keys.OUTBOX_GROUP)
        await self.outbox_sort()

    # ------------------------------------------------------------------ helpers

    def _args(self, job_id: str, now: str, actor: str, intent: Intent | None = None) -> list[Any]:
        """The ARGV every state-changing script starts with (lua/_lib.lua); ``actor``: who the
        action's audit entry names, ``intent``: what else it records (docs/protocol.md § Audit)."""
        return [job_id, now, self.config.retention_s, actor_arg(actor, intent)]

    @staticmethod
    def _keys(state: decide.JobState | None, jk: keys.JobKeys) -> list[str]:
        ks = jk.for_script()
        if state is not None and state.idem_key:
            ks.append(keys.create_idem(state.submitter, state.idem_key))
        return ks

    @staticmethod
    def _snapshot_dict(meta: dict[str, str]) -> dict[str, Any] | None:
        if not meta:
            return None
        return decide.JobState.from_meta(meta).snapshot().model_dump(mode="json")

    def _raise_for(self, result: list[Any], job_id: str) -> None:
        scripts.raise_for(result, job_id, self._snapshot_dict)

    async def _meta(self, job_id: str) -> dict[str, str]:
        meta: dict[str, str] = await self.r.hgetall(keys.job(job_id).meta)
        if not meta and self.on_missing is not None and keys.is_job_id(job_id) and await self.on_missing(job_id):
            meta = await self.r.hgetall(keys.job(job_id).meta)
        return meta

    async def metas(self, job_ids: list[str]) -> list[dict[str, str]]:
        """Several jobs' meta in one pipeline (one pooled connection, one round trip)."""
        async with self.r.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hgetall(keys.job(job_id).meta)
            return list(await pipe.execute())

    async def get(self, job_id: str) -> decide.JobState:
        return decide.require(await self._meta(job_id), job_id)

    async def is_finished(self, job_id: str) -> bool:
        """True once the job is terminal (or gone after its retention)."""
        return bool(await self.r.hget(keys.job(job_id).meta, "terminal") != "0")

    async def snapshot(self, job_id: str) -> JobSnapshot:
        return await self.snapshot_of(await self.get(job_id))

    async def snapshot_of(self, state: decide.JobState) -> JobSnapshot:
        """The job as GET answers it; a running node's ``heartbeat_at`` comes from the heartbeat index,
        the review claim from its own key."""
        job_id = state.job_id
        jk = keys.job(job_id)
        snap = state.snapshot()
        node = snap.current_node
        async with self.r.pipeline(transaction=False) as pipe:  # one round trip for what lies apart
            pipe.hmget(jk.claim, "reviewer", "expires_at")
            pipe.hget(jk.notes, "flag")
            pipe.lrange(jk.comments, -COMMENTS_SHOWN, -1)
            pipe.zscore(jk.heartbeats, job_id)
            running = [n for n in snap.subject_nodes if n.status == "RUNNING"]
            for n in running:
                pipe.zscore(jk.heartbeats, keys.node_member(job_id, n.node_instance_id))
            (reviewer, expires_at), flag, comments, beat, *beats = await pipe.execute()
        snap.claim = ClaimView(reviewer=reviewer, expires_at=expires_at) if reviewer and expires_at else None
        snap.flag = JobFlag.model_validate_json(flag) if flag else None
        snap.comments = [JobComment.model_validate_json(c) for c in comments]
        if node is not None and node.status == "RUNNING" and beat is not None:
            snap.current_node = node.model_copy(update={"heartbeat_at": now_iso(beat / 1000)})
        at = {n.node_instance_id: b for n, b in zip(running, beats, strict=True) if b is not None}
        snap.subject_nodes = [
            n.model_copy(update={"heartbeat_at": now_iso(at[n.node_instance_id] / 1000)})
            if n.node_instance_id in at
            else n
            for n in snap.subject_nodes
        ]
        return snap

    # ------------------------------------------------------------------ create

    async def create_job(
        self,
        submitter: str,
        image: ImageRef,
        idem_key: str | None = None,
        review_quorum: int = 1,
        quorum_policy: str = "all",
        boxes: list[Detection] | None = None,
    ) -> Reply:
        """Create a job (DETECTING, version 1, DETECT_SUBJECTS queued), idempotently per submitter+key;
        ``review_quorum`` ≥ 2: each pause needs that many reviewers, decided by ``quorum_policy``
        (statecore.quorum). ``boxes`` (statecore.prelabelled): no detector, the job waits for review
        with them as the model's proposal."""
        if quorum_policy not in QUORUM_POLICIES:
            raise errors.InvalidRequest(f"quorum_policy must be one of {', '.join(QUORUM_POLICIES)}")
        partition = keys.create_idem_partition(submitter, idem_key) if idem_key else None
        for _ in range(STALE_RETRIES):
            job_id = keys.new_job_id(partition)
            jk = keys.job(job_id)
            now = now_iso()
            now_ms = int(time.time() * 1000)
            plan, _cmd = decide.plan_create(
                job_id,
                submitter,
                image,
                idem_key,
                now,
                now_ms,
                review_quorum,
                self.config.quality_gate,
                quorum_policy,
                boxes,
                gate_spot.policy_fields(
                    self.config.mask_spot_check, self.config.quality_gate, self.config.mask_spot_salt
                ),
            )
            # a replay must match
            fingerprint = decide.create_fingerprint(image.sha256, review_quorum, quorum_policy, boxes)
            body = decide.create_response(job_id, fingerprint)
            ks = jk.for_script() + ([keys.create_idem(submitter, idem_key)] if idem_key else [])
            res = await self._scripts["create_job"](
                keys=ks,
                args=self._args(job_id, now, submitter)
                + [plan.to_json(now, self.config.archive), fingerprint, body, int(time.time() * 1000)]
                + ([prelabelled.AUDIT_OUTCOME] if boxes is not None else []),
            )
            code = res[0]
            if code == "OK":
                return Reply(202, body, False, job_id)
            if code == "REPLAY":
                return Reply(202, res[1], True, _job_id_of(res[1]))
            if code == "IDEMPOTENCY_CONFLICT":
                existing = res[1]
                snap = self._snapshot_dict(await self._meta(existing))
                raise errors.IdempotencyConflict(
                    "this Idempotency-Key was already used for a different image, review_quorum, quorum_policy "
                    "or boxes",
                    job_id=existing,
                    snapshot=snap,
                )
            # COLLISION: an 80-bit id collided; draw another.
        raise errors.StaleRead("could not allocate a job id")

    # ------------------------------------------------------------------ intervene

    async def intervene(
        self, job_id: str, req: InterventionRequest, reviewer: str, *, role: str = "", proxy_user: str = ""
    ) -> Reply:
        """Consume the active pause exactly once (docs/protocol.md § Intervention, checks 2–8, and
        § Snapshot echo and the fifth gate after check 7). Every 409 carries ``rebase``. ``role`` and
        ``proxy_user`` (the token's role, the user a trusted proxy named): what the audit entry
        records with the intervention's id and payload hash (docs/protocol.md § Audit)."""
        phash = payload_hash(req.hashed_body(), reviewer)
        intent = Intent(role=role, proxy_user=proxy_user, intervention_id=req.intervention_id, payload_hash=phash)
        jk = keys.job(job_id)
        for _ in range(STALE_RETRIES):
            state = await self.get(job_id)  # 404 before any state is touched
            pause = state.active_pause
            snap_id = req.snapshot_id or (pause.snapshot_id if pause is not None else "")
            try:
                decide.check_bboxes_in_image(req.subjects or [], state.image.width, state.image.height)
            except errors.InvalidRequest:  # refused from the body and the job alone: audited all the same
                await self.audit_only(
                    job_id, reviewer, "INTERVENE", "REFUSED:INVALID_REQUEST", req.base_version, snap_id, intent
                )
                raise
            now = now_iso()
            now_ms = int(time.time() * 1000)
            gate = gates.snapshot_gate(state, req, self.config.continuable_workflow_versions)
            if gate:
                plan = None
                if gate == gates.WORKFLOW_VERSION_INCOMPATIBLE:
                    plan = gates.plan_reoffer(state, now, now_ms, self.config.workflow_version)
                ip = decide.InterventionPlan(plan, None, None)
            else:
                ip = decide.plan_intervention(state, req, reviewer, now, now_ms)
            q = None if gate else quorum.step(state, req, reviewer, ip, now, now_ms, self.config.workflow_version)
            if q is not None:  # a pause that needs several reviewers (docs/protocol.md § Quorum)
                ip = decide.InterventionPlan(q.plan, q.response, None)
            reviewed = None if gate else auto_plan.on_reviewed(ip.plan, state)  # against the box policy
            resp = ip.response.model_dump_json() if ip.response else ""
            res = await self._scripts["consume_pause"](
                keys=self._keys(state, jk),
                args=self._args(job_id, now, reviewer, intent)
                + [
                    req.intervention_id,
                    phash,
                    str(req.base_version),
                    req.pause_token,
                    str(state.version),
                    ip.plan.to_json(now, self.config.archive) if ip.plan else "",
                    resp,
                    ip.invalid.message if ip.invalid else "",
                    gate,
                    snap_id,
                    *((q.mode, q.seen, q.votes_json, q.event, q.audit_action) if q else ("", "", "", "", "")),
                ],
            )
            if res[0] == "OK":
                await auto_store.after_review(self, job_id, reviewed)  # the live check: drop to shadow?
                return Reply(200, resp, False, job_id)
            if res[0] == "REPLAY":
                return Reply(200, res[1], True, job_id)
            if res[0] == "STALE":
                continue
            try:
                self._raise_for(res, job_id)
            except errors.Conflict as e:
                await self.with_claim(e)
                e.details["rebase"] = await rebase.rebase_for(self.r, job_id, req.base_version, e.snapshot)
                raise
        raise errors.StaleRead("the job kept changing; try again", job_id=job_id)

    # ------------------------------------------------------------------ cancel

    async def cancel(
        self, job_id: str, who: str, *, role: str = "", reason: str = "", proxy_user: str = ""
    ) -> JobSnapshot:
        """End the job CANCELLED (idempotent). ``role``, ``proxy_user`` and ``reason`` (why, as the
        operator gave it: ``hitl cancel --reason``): what the CANCEL audit entry records besides who."""
        intent = Intent(role=role, proxy_user=proxy_user, reason=reason)
        jk = keys.job(job_id)
        # A job cutting its subjects changes with every one of their nodes' starts and answers: a cancel
        # racing them retries as their reports do (spread out, as many times).
        for attempt in range(NODE_STALE_RETRIES):
            await wait_after_stale(attempt)
            state = await self.get(job_id)
            now = now_iso()
            # Cancelled or ended already: the script answers (and audits) without a plan.
            done = state.status == JobStatus.CANCELLED or is_terminal(state.status)
            plan = "" if done else decide.plan_cancel(state, who, now).to_json(now, self.config.archive)
            res = await self._scripts["cancel"](
                keys=self._keys(state, jk), args=self._args(job_id, now, who, intent) + [str(state.version), plan]
            )
            if res[0] in ("OK", "ALREADY"):
                return await self.snapshot(job_id)
            if res[0] == "STALE":
                continue
            try:
                self._raise_for(res, job_id)
            except errors.Conflict as e:
                raise await self.with_claim(e) from None
        raise errors.StaleRead("the job kept changing; try again", job_id=job_id)

    # ------------------------------------------------------------------ listing

    async def list_jobs(
        self,
        *,
        submitter: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        unclaimed_for: str | None = None,
        flagged: bool | None = None,
    ) -> tuple[list[JobSummary], str | None]:
        """Newest first over all partitions; with a waiting ``status`` (or ``WAITING``), the review
        queue, oldest pause first. Exact pages: see :mod:`statecore.listing`. Each summary carries
        the job's claim and flag; ``unclaimed_for``: leave out jobs claimed by anyone but that reviewer
        (and those that reviewer skipped a moment ago); ``flagged``: only (or no) flagged jobs."""
        return await listing.list_jobs(
            self.r,
            self.metas,
            submitter=submitter,
            status=status,
            limit=limit,
            cursor=cursor,
            read_claims=self.claims_of,
            unclaimed_for=unclaimed_for,
            read_notes=self.notes_of,
            flagged=flagged,
        )

    async def count_by_status(self) -> dict[str, int]:
        """Jobs stored per status, every status (zero included), from the counters the scripts keep
        (statecore.counters): O(partitions), whatever the number of stored jobs."""
        return await counters.read_statuses(self.r)

    async def prune_expired(self, now_ms: int | None = None, batch: int = 1000) -> int:
        """Drop finished jobs whose retention has passed from the listing index (their records
        expire by TTL; the index is a sorted set without one). Returns how many were dropped."""
        now_ms = now_ms or int(time.time() * 1000)
        dropped = 0
        for p in range(keys.PARTITIONS):  # one script per partition: uncounts each job's final status once
            dropped += await counters.prune(self.r, p, now_ms, batch)
        return dropped

    async def oldest_pause_age_s(self) -> float:
        oldest = None
        for p in range(keys.PARTITIONS):
            first = await self.r.zrange(keys.waiting(p), 0, 0, withscores=True)
            if first and (oldest is None or first[0][1] < oldest):
                oldest = first[0][1]
        return 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)


def _job_id_of(body: str) -> str:
    return str(json.loads(body)["job_id"])


def dumps(obj: Any) -> str:
    return canonical_json(obj)
