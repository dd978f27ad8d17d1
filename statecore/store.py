"""The effectful half of the state core: reads a job, asks ``decide`` for a plan,
commits it through one Lua script. Async, redis-py with hiredis, one pool.

Every state change follows the same shape: read the job's meta (one HGETALL),
compute the plan purely, run the operation's script with the version the plan
was computed from. The script re-checks the protocol's preconditions atomically and
refuses with ``STALE`` if the job moved in between; the store then re-reads and
re-plans (bounded), so no decision is ever applied to a state it was not made for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from . import decide, durable, errors, keys, listing, scripts
from .ids import canonical_json, now_iso, payload_hash
from .models import (
    CreateJobResponse,
    Event,
    ImageRef,
    InterventionRequest,
    JobSnapshot,
    JobSummary,
    NodeCommand,
    NodeReport,
    Pause,
)
from .states import JobStatus, is_terminal

log = logging.getLogger("hitl.store")

STALE_RETRIES = 20


@dataclass
class StoreConfig:
    retention_s: int = 7 * 24 * 3600
    node_timeout_s: float = 600.0


@dataclass
class Reply:
    """An HTTP-ready answer whose bytes must be replayed identically."""

    status_code: int
    body: str
    replayed: bool
    job_id: str


@dataclass
class OutboxEntry:
    stream: str
    entry_id: str
    command: NodeCommand
    deliveries: int = 1


class Store:
    def __init__(self, client: Any, config: StoreConfig | None = None, *, cluster: bool = False) -> None:
        self.r = client
        self.cluster = cluster
        self.config = config or StoreConfig()
        self.sync_command: tuple[Any, ...] | None = None  # --durability strict: see statecore.durable
        self.sync_acks = 0
        self._scripts = {name: durable.synced(self, s) for name, s in scripts.register(client).items()}

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
            client = aioredis.Redis.from_url(
                url,
                decode_responses=True,
                max_connections=max_connections,
                health_check_interval=30,
                **timeouts,
            )
        return cls(client, config, cluster=cluster)

    async def close(self) -> None:
        await self.r.aclose()

    async def ping(self) -> bool:
        return bool(await self.r.ping())

    async def ensure_groups(self) -> None:
        """Create the dispatchers' consumer group on every outbox stream (idempotent)."""
        for stream in keys.all_outboxes():
            try:
                await self.r.xgroup_create(stream, keys.OUTBOX_GROUP, id="0", mkstream=True)
            except ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    # ------------------------------------------------------------------ helpers

    def _deadline_ms(self) -> int:
        return int((time.time() + self.config.node_timeout_s) * 1000)

    def _args(self, job_id: str, now: str) -> list[Any]:
        return [job_id, now, self.config.retention_s]

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
        return meta

    async def get(self, job_id: str) -> decide.JobState:
        return decide.require(await self._meta(job_id), job_id)

    async def is_finished(self, job_id: str) -> bool:
        """True once the job is terminal (or gone after its retention)."""
        return bool(await self.r.hget(keys.job(job_id).meta, "terminal") != "0")

    async def snapshot(self, job_id: str) -> JobSnapshot:
        return (await self.get(job_id)).snapshot()

    # ------------------------------------------------------------------ create

    async def create_job(self, submitter: str, image: ImageRef, idem_key: str | None = None) -> Reply:
        """Create a job (DETECTING, version 1, DETECT_SUBJECTS queued), idempotently per submitter+key."""
        partition = keys.create_idem_partition(submitter, idem_key) if idem_key else None
        for _ in range(STALE_RETRIES):
            job_id = keys.new_job_id(partition)
            jk = keys.job(job_id)
            now = now_iso()
            plan, _cmd = decide.plan_create(job_id, submitter, image, idem_key, now, self._deadline_ms())
            body = CreateJobResponse(job_id=job_id, status=plan.status, version=1).model_dump_json()
            ks = jk.for_script() + ([keys.create_idem(submitter, idem_key)] if idem_key else [])
            res = await self._scripts["create_job"](
                keys=ks, args=self._args(job_id, now) + [plan.to_json(now), image.sha256, body, int(time.time() * 1000)]
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
                    "this Idempotency-Key was already used for a different image", job_id=existing, snapshot=snap
                )
            # COLLISION: an 80-bit id collided; draw another.
        raise errors.StaleRead("could not allocate a job id")

    # ------------------------------------------------------------------ intervene

    async def intervene(self, job_id: str, req: InterventionRequest, reviewer: str) -> Reply:
        """Consume the active pause exactly once (docs/protocol.md § Intervention, checks 2–8)."""
        body = req.model_dump(mode="json")
        phash = payload_hash(body, reviewer)
        jk = keys.job(job_id)
        for _ in range(STALE_RETRIES):
            state = await self.get(job_id)  # 404 before any state is touched
            decide.check_bboxes_in_image(req.subjects, state.image.width, state.image.height)
            now = now_iso()
            now_ms = int(time.time() * 1000)
            ip = decide.plan_intervention(state, req, reviewer, now, now_ms, self._deadline_ms())
            resp = ip.response.model_dump_json() if ip.response else ""
            res = await self._scripts["consume_pause"](
                keys=self._keys(state, jk),
                args=self._args(job_id, now)
                + [
                    req.intervention_id,
                    phash,
                    str(req.base_version),
                    req.pause_token,
                    str(state.version),
                    ip.plan.to_json(now) if ip.plan else "",
                    resp,
                    ip.invalid.message if ip.invalid else "",
                ],
            )
            if res[0] == "OK":
                return Reply(200, resp, False, job_id)
            if res[0] == "REPLAY":
                return Reply(200, res[1], True, job_id)
            if res[0] == "STALE":
                continue
            self._raise_for(res, job_id)
        raise errors.StaleRead("the job kept changing; try again", job_id=job_id)

    # ------------------------------------------------------------------ cancel

    async def cancel(self, job_id: str, who: str) -> JobSnapshot:
        jk = keys.job(job_id)
        for _ in range(STALE_RETRIES):
            state = await self.get(job_id)
            now = now_iso()
            if state.status == JobStatus.CANCELLED:
                return state.snapshot()
            if is_terminal(state.status):
                raise errors.JobTerminal(
                    scripts._MESSAGES["JOB_TERMINAL"], job_id=job_id, snapshot=state.snapshot().model_dump(mode="json")
                )
            plan = decide.plan_cancel(state, who, now)
            res = await self._scripts["cancel"](
                keys=self._keys(state, jk), args=self._args(job_id, now) + [str(state.version), plan.to_json(now)]
            )
            if res[0] in ("OK", "ALREADY"):
                return await self.snapshot(job_id)
            if res[0] == "STALE":
                continue
            self._raise_for(res, job_id)
        raise errors.StaleRead("the job kept changing; try again", job_id=job_id)

    # ------------------------------------------------------------------ reports

    async def node_started(self, cmd: NodeCommand) -> bool:
        """Mark the node RUNNING (attempt + 1). False when the node is no longer current: skip it."""
        return await self._report(cmd.job_id, cmd.node_instance_id, cmd.node_type, final=False) == "OK"

    async def apply_report(self, report: NodeReport, *, by_inspector: bool = False) -> str:
        """Apply a node's result at most once: ``OK``, ``DUPLICATE`` or ``IGNORED``.

        ``by_inspector``: the report is the inspector's verdict that the node passed its deadline.
        It is recorded apart from the model's own report, so when the model answers after all,
        its report is ``IGNORED`` with a ``REPORT_IGNORED`` event (reason ``NODE_TIMED_OUT``),
        and only a replay of either report is a silent ``DUPLICATE``."""
        return await self._report(
            report.job_id,
            report.node_instance_id,
            report.node_type,
            final=True,
            report=report,
            by_inspector=by_inspector,
        )

    async def _report(
        self,
        job_id: str,
        nid: str,
        node_type: str,
        *,
        final: bool,
        report: NodeReport | None = None,
        by_inspector: bool = False,
    ) -> str:
        jk = keys.job(job_id)
        for _ in range(STALE_RETRIES):
            meta = await self._meta(job_id)
            if not meta:
                return "IGNORED"  # finished and expired long ago
            state = decide.JobState.from_meta(meta)
            now = now_iso()
            # A node whose result was already applied stays current (COMPLETED/FAILED/TIMED_OUT) until
            # the next one; its redelivered report must not be planned again (the job has moved on, so
            # the move could be illegal): the script answers DUPLICATE from the reports set.
            current = (
                state.current_node is not None
                and state.current_node.node_instance_id == nid
                and state.current_node.status in ("QUEUED", "RUNNING")
            )
            plan_json = ""
            if current and meta.get("terminal") != "1":
                if final:
                    assert report is not None
                    plan = decide.plan_report(state, report, now, int(time.time() * 1000), self._deadline_ms())
                else:
                    plan = decide.plan_node_started(state, nid)
                plan_json = plan.to_json(now)
            res = await self._scripts["apply_report"](
                keys=self._keys(state, jk),
                args=self._args(job_id, now)
                + [nid, str(state.version), plan_json, "1" if final else "0", node_type, "1" if by_inspector else "0"],
            )
            if res[0] == "STALE":
                continue
            if res[0] == "JOB_NOT_FOUND":
                return "IGNORED"
            if res[0] == "IGNORED":
                log.info("report ignored job=%s node=%s reason=%s", job_id, nid, res[1])
            return str(res[0])
        raise errors.StaleRead("the job kept changing while applying a report", job_id=job_id)

    # ------------------------------------------------------------------ events

    @staticmethod
    def _event(job_id: str, raw: str) -> Event:
        e = json.loads(raw)
        return Event(
            id=e["id"],
            type=e["type"],
            job_id=job_id,
            version=e["version"],
            at=e["at"],
            data={"status": e["status"], **e["data"]},
        )

    async def events_after(self, job_id: str, after: int = 0, count: int = 100_000) -> list[Event]:
        """Events with id > ``after``, oldest first (ids are 1-based list positions)."""
        raws = await self.r.lrange(keys.job(job_id).events, max(after, 0), max(after, 0) + count - 1)
        return [self._event(job_id, raw) for raw in raws]

    async def stream_events(self, job_id: str, after: int = 0, poll_s: float = 0.2) -> AsyncIterator[Event]:
        """The whole history after ``after``; then, for a live job, live events until JOB_FINISHED.
        A simple polling reader for scripts; the SSE server uses serve_app.events.EventHub."""
        last = after
        finished = False
        for ev in await self.events_after(job_id, after):
            yield ev
            last = ev.id
            finished = finished or ev.type == "JOB_FINISHED"
        if finished:
            return
        if await self.is_finished(job_id):
            # It ended after the history was read: the tail up to JOB_FINISHED is in the list now.
            for ev in await self.events_after(job_id, last):
                yield ev
            return
        while True:
            await asyncio.sleep(poll_s)
            for ev in await self.events_after(job_id, last):
                yield ev
                last = ev.id
                if ev.type == "JOB_FINISHED":
                    return

    # ------------------------------------------------------------------ pauses & listing

    async def pause_history(self, job_id: str) -> list[Pause]:
        raw = await self.r.hgetall(keys.job(job_id).pauses)
        pauses = [Pause.model_validate_json(v) for v in raw.values()]
        return sorted(pauses, key=lambda p: p.created_at)

    async def list_jobs(
        self, *, submitter: str | None = None, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[JobSummary], str | None]:
        """Newest first over all partitions; with a waiting ``status`` (or ``WAITING``), the review
        queue, oldest pause first. Exact pages: see :mod:`statecore.listing`."""
        return await listing.list_jobs(
            self.r, self._meta, submitter=submitter, status=status, limit=limit, cursor=cursor
        )

    async def count_by_status(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in range(keys.PARTITIONS):
            for jid in await self.r.zrange(keys.jobs(p), 0, -1):
                st = await self.r.hget(keys.job(jid).meta, "status")
                if st:
                    counts[st] = counts.get(st, 0) + 1
        return counts

    async def prune_expired(self, now_ms: int | None = None, batch: int = 1000) -> int:
        """Drop finished jobs whose retention has passed from the listing index (their records
        expire by TTL; the index is a sorted set without one). Returns how many were dropped."""
        now_ms = now_ms or int(time.time() * 1000)
        dropped = 0
        for p in range(keys.PARTITIONS):
            gone = await self.r.zrangebyscore(keys.expiring(p), "-inf", now_ms, start=0, num=batch)
            if gone:
                async with self.r.pipeline(transaction=True) as pipe:  # one slot: fine on a cluster
                    pipe.zrem(keys.jobs(p), *gone)
                    pipe.zrem(keys.expiring(p), *gone)
                    await pipe.execute()
                dropped += len(gone)
        return dropped

    async def prune_consumers(self, keep: str, idle_ms: int) -> int:
        """Forget outbox consumers (dispatchers of earlier processes) idle for ``idle_ms`` that hold
        nothing. A consumer with pending entries is kept: deleting it would drop them from the
        group's pending list; reclaiming moves them first, and a later pass deletes the name."""
        deleted = 0
        for stream in keys.all_outboxes():
            try:
                consumers = await self.r.xinfo_consumers(stream, keys.OUTBOX_GROUP)
            except ResponseError:  # no such stream or group yet
                continue
            for c in consumers:
                if c["name"] != keep and int(c["pending"]) == 0 and int(c["idle"]) >= idle_ms:
                    await self.r.xgroup_delconsumer(stream, keys.OUTBOX_GROUP, c["name"])
                    deleted += 1
        return deleted

    async def oldest_pause_age_s(self) -> float:
        oldest = None
        for p in range(keys.PARTITIONS):
            first = await self.r.zrange(keys.waiting(p), 0, 0, withscores=True)
            if first and (oldest is None or first[0][1] < oldest):
                oldest = first[0][1]
        return 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)

    async def overdue_nodes(self, now_ms: int | None = None) -> list[str]:
        """Jobs whose queued or running node is past its deadline (for the inspector)."""
        now_ms = now_ms or int(time.time() * 1000)
        out: list[str] = []
        for p in range(keys.PARTITIONS):
            out += await self.r.zrangebyscore(keys.running(p), "-inf", now_ms)
        return out

    # ------------------------------------------------------------------ outbox

    @staticmethod
    def _entries(stream: str, entries: list[Any]) -> list[OutboxEntry]:
        out = []
        for eid, fields in entries:
            if fields is None:  # deleted while pending
                continue
            out.append(OutboxEntry(stream, eid, NodeCommand.model_validate_json(fields["cmd"])))
        return out

    async def outbox_read(self, consumer: str, count: int = 16, block_ms: int = 1000) -> list[OutboxEntry]:
        """New commands for this consumer (consumer group: each entry goes to one dispatcher)."""
        streams = {s: ">" for s in keys.all_outboxes()}
        if not self.cluster:
            # BLOCK 0 would wait forever; block_ms=0 means "do not block", as in cluster mode below.
            res = await self.r.xreadgroup(keys.OUTBOX_GROUP, consumer, streams, count=count, block=block_ms or None)
            out: list[OutboxEntry] = []
            for stream, entries in res or []:
                out += self._entries(stream, entries)
            return out
        # A multi-stream XREADGROUP would be CROSSSLOT on a cluster: poll each partition instead.
        out = []
        for s in streams:
            res = await self.r.xreadgroup(keys.OUTBOX_GROUP, consumer, {s: ">"}, count=count)
            for stream, entries in res or []:
                out += self._entries(stream, entries)
        if not out and block_ms:
            await asyncio.sleep(min(block_ms, 200) / 1000)
        return out

    async def outbox_ack(self, entry: OutboxEntry) -> None:
        """Acknowledge and delete: a handled command's trace lives on in the job's events
        (NODE_STARTED / NODE_COMPLETED), so the stream holds only work still to do."""
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.xack(entry.stream, keys.OUTBOX_GROUP, entry.entry_id)
            pipe.xdel(entry.stream, entry.entry_id)
            await pipe.execute()

    async def outbox_reclaim(self, consumer: str, min_idle_ms: int, count: int = 64) -> list[OutboxEntry]:
        """Take over entries another dispatcher has held for ``min_idle_ms`` without acking."""
        out: list[OutboxEntry] = []
        for s in keys.all_outboxes():
            res = await self.r.xautoclaim(
                s, keys.OUTBOX_GROUP, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count
            )
            out += self._entries(s, res[1])
        return out

    async def outbox_pending(self) -> int:
        """Commands delivered but not yet acked, plus commands not yet delivered."""
        total = 0
        for s in keys.all_outboxes():
            try:
                groups = await self.r.xinfo_groups(s)
            except ResponseError:
                continue
            for g in groups:
                if g["name"] == keys.OUTBOX_GROUP:
                    total += int(g.get("pending", 0)) + int(g.get("lag") or 0)
        return total

    async def outbox_commands(self, job_id: str) -> list[NodeCommand]:
        """The job's commands still in its outbox stream (not yet acknowledged; for checks and tests)."""
        out = []
        for _eid, f in await self.r.xrange(keys.job(job_id).outbox):
            if f.get("job") == job_id:
                out.append(NodeCommand.model_validate_json(f["cmd"]))
        return out


def _job_id_of(body: str) -> str:
    return str(json.loads(body)["job_id"])


def dumps(obj: Any) -> str:
    return canonical_json(obj)
