"""The node lifecycle's reads and small writes for the inspector and the executors: heartbeats,
the inspector's per-partition lease, nodes whose heartbeat lapsed or whose deadline passed, and
the backlog (docs/protocol.md § Executors and the outbox). A mixin of :class:`statecore.store.Store`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from . import errors, keys, scripts
from .errors import JobNotFound
from .ids import now_iso


class LifecycleMixin:
    r: Any
    cluster: bool
    sync_command: tuple[Any, ...] | None
    sync_acks: int
    _scripts: dict[str, Any]
    config: Any
    get: Any  # Store.get
    _keys: Any  # Store._keys
    _args: Any  # Store._args

    async def archive_ack(self, job_id: str, version: int | None, last_event_id: int = 0, audit_seq: int = 0) -> str:
        """The archive holds the finished job as far as ``version``, ``last_event_id`` and its audit
        entry ``audit_seq``: start its
        records' retention now (docs/protocol.md § Archive). ``OK``; ``STALE`` when the job went
        further since the copy (copy again); ``NOT_FINISHED``; ``JOB_NOT_FOUND``. ``version`` None
        acknowledges whatever the job holds (archiving was turned off)."""
        try:
            state = await self.get(job_id)
        except JobNotFound:
            return "JOB_NOT_FOUND"
        args = self._args(job_id, now_iso(), "archiver") + [
            "" if version is None else str(version),
            str(last_event_id),
            str(audit_seq),
        ]
        res = await self._scripts["archive_ack"](keys=self._keys(state, keys.job(job_id)), args=args)
        return str(res[0])

    async def server_ms(self, key: str) -> int:
        """The Redis server's clock in ms, read on the node that holds ``key`` (on a cluster each
        node keeps its own): deadlines, backoffs, heartbeats and lapses are all read on it, never
        on the clock of the process that happens to act."""
        if self.cluster:
            t = await self.r.eval("return redis.call('TIME')", 1, key)
        else:
            t = await self.r.time()
        return int(t[0]) * 1000 + int(t[1]) // 1000

    async def heartbeat(self, job_id: str, node_instance_id: str) -> bool:
        """Renew a running node's heartbeat; False once the node is no longer running (stop)."""
        jk = keys.job(job_id)
        args = [job_id, node_instance_id, int(time.time() * 1000), "", 0, ""]
        res = await self._scripts["heartbeat"](
            keys=[jk.meta, jk.heartbeats, jk.executor_of(node_instance_id)], args=args
        )
        return bool(res)

    async def node_status(self, job_id: str, node_instance_id: str) -> str | None:
        """The node's status (``QUEUED``, ``RETRY_WAIT``, ``RUNNING``, ``COMPLETED``, ``TIMED_OUT``,
        ``CANCELLED``…) while it is the job's current node or one of its live subject nodes, else
        None (superseded, or the job is gone): one HMGET, for a dispatcher watching its outstanding calls."""
        node_id, node, subject = await self.r.hmget(
            keys.job(job_id).meta, "node_id", "current_node", keys.node_field(node_instance_id)
        )
        if subject:
            node = subject
        elif node_id != node_instance_id or not node:
            return None
        return str(json.loads(node).get("status") or "") or None

    async def mark_writeback(self, job_id: str, node_instance_id: str, ttl_ms: int = 120_000) -> None:
        """A result of this node waits in a write-back spool: the inspector leaves the node alone
        until the marker is cleared (applied or given up) or, its holder gone, expires."""
        await self.r.set(keys.job(job_id).writeback_of(node_instance_id), "1", px=ttl_ms)

    async def clear_writeback(self, job_id: str, node_instance_id: str) -> None:
        await self.r.delete(keys.job(job_id).writeback_of(node_instance_id))

    async def writebacks_pending(self, nodes: list[tuple[str, str]]) -> set[tuple[str, str]]:
        """Those of ``nodes`` (job id, node id) whose result waits in a write-back spool."""
        if not nodes:
            return set()
        async with self.r.pipeline(transaction=False) as pipe:
            for job_id, nid in nodes:
                pipe.exists(keys.job(job_id).writeback_of(nid))
            found = await pipe.execute()
        return {node for node, n in zip(nodes, found, strict=True) if n}

    async def executor_of(self, job_id: str, node_instance_id: str) -> str | None:
        """Who runs the node now, as its executor recorded itself (None: nobody says so)."""
        name: str | None = await self.r.get(keys.job(job_id).executor_of(node_instance_id))
        return name

    async def acquire_lease(self, p: int, owner: str, ttl_ms: int) -> str | None:
        """Take or renew the inspector lease of partition ``p``: its value (owner|fencing token),
        or None while another inspector holds it."""
        res = await self._scripts["lease"](
            keys=[keys.inspector_lease(p), keys.inspector_fence(p)], args=[owner, ttl_ms]
        )
        return str(res) if res else None

    async def sweep_read(
        self, owner: str, ttl_ms: int, lapse_ms: int, grace_ms: int, count: int = 500
    ) -> list[tuple[int, str, list[str], list[str]]]:
        """The inspector's reads of one sweep, pipelined: every partition's lease taken or renewed
        (lease.lua), and on the clock of the server holding the partition, its nodes whose heartbeat
        lapsed ``lapse_ms`` ago and those past their deadline by ``grace_ms``. ``(partition, lease,
        lapsed, overdue)`` for each partition whose lease ``owner`` holds. A few round trips, not four
        sequential ones per partition (issue 37): the sweep runs every few seconds in every replica."""
        parts = range(keys.PARTITIONS)
        if self.cluster:  # each master keeps its own clock: read on the one holding the partition
            async with self.r.pipeline(transaction=False) as pipe:
                for p in parts:
                    pipe.eval("return redis.call('TIME')", 1, keys.heartbeats(p))
                clocks = [int(t[0]) * 1000 + int(t[1]) // 1000 for t in await pipe.execute()]
        else:
            t = await self.r.time()
            clocks = [int(t[0]) * 1000 + int(t[1]) // 1000] * len(parts)
        lease_lua = scripts.source("lease")
        lease = self.r.register_script(lease_lua)
        sync = None if self.cluster else self.sync_command  # as durable.synced: the leases written, then WAITAOF
        async with self.r.pipeline(transaction=False) as pipe:
            for p in parts:
                lease_keys, args = [keys.inspector_lease(p), keys.inspector_fence(p)], [owner, ttl_ms]
                if self.cluster:  # a cluster pipeline does not load a script missing on a master
                    pipe.eval(lease_lua, 2, *lease_keys, *args)
                else:  # the pipeline loads it first when Redis lacks it
                    await lease(keys=lease_keys, args=args, client=pipe)
                pipe.zrangebyscore(keys.heartbeats(p), "-inf", clocks[p] - lapse_ms, start=0, num=count)
                pipe.zrangebyscore(keys.running(p), "-inf", clocks[p] - grace_ms, start=0, num=count)
            if sync is not None:
                pipe.execute_command(*sync)
            res = await pipe.execute()
        if sync is not None:
            acks = res[-1]
            acked = int(acks[0] if isinstance(acks, list) else acks)
            if acked < self.sync_acks:
                raise errors.StoreUnavailable(f"{sync[0]} confirmed {acked} of {self.sync_acks}")
        return [(p, str(res[3 * p]), res[3 * p + 1], res[3 * p + 2]) for p in parts if res[3 * p]]

    async def lapsed_heartbeats(self, p: int, before_ms: int, count: int = 500) -> list[str]:
        """Index members (``keys.split_member``) of partition ``p`` whose running node has not beaten
        since ``before_ms``."""
        found: list[str] = await self.r.zrangebyscore(keys.heartbeats(p), "-inf", before_ms, start=0, num=count)
        return found

    async def past_deadline(self, p: int, now_ms: int, count: int = 500) -> list[str]:
        """Index members (``keys.split_member``) of partition ``p`` whose running node is past its deadline."""
        found: list[str] = await self.r.zrangebyscore(keys.running(p), "-inf", now_ms, start=0, num=count)
        return found

    async def backlog(self) -> tuple[int, float]:
        """Node commands queued and not yet started, over every partition, and the oldest one's
        age in seconds: O(partitions), whatever the number of stored jobs."""
        async with self.r.pipeline(transaction=False) as pipe:
            for p in range(keys.PARTITIONS):
                pipe.zcard(keys.queued(p))
                pipe.zrange(keys.queued(p), 0, 0, withscores=True)
            res = await pipe.execute()
        total = sum(int(n) for n in res[0::2])
        oldest = min((first[0][1] for first in res[1::2] if first), default=None)
        return total, 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)
