"""The outbox: node commands in one Redis stream per partition, read by the dispatchers through a
consumer group (docs/protocol.md § Executors and the outbox). A mixin of :class:`statecore.store.Store`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from . import keys
from .models import NodeCommand


@dataclass
class OutboxEntry:
    stream: str
    entry_id: str
    command: NodeCommand
    deliveries: int = 1


class OutboxMixin:
    r: Any
    cluster: bool
    _outbox_cursor: int = 0  # the partition the next outbox read starts at

    @staticmethod
    def _entries(stream: str, entries: list[Any]) -> list[OutboxEntry]:
        out = []
        for eid, fields in entries:
            if fields is None:  # deleted while pending
                continue
            out.append(OutboxEntry(stream, eid, NodeCommand.model_validate_json(fields["cmd"])))
        return out

    async def outbox_read(self, consumer: str, count: int = 16, block_ms: int = 1000) -> list[OutboxEntry]:
        """Up to ``count`` new commands for this consumer (consumer group: each entry goes to one
        dispatcher), and no more: a dispatcher reads only what it can start now, the rest stays in
        the outbox for admission control to count and for other dispatchers to take.

        COUNT of a multi-stream XREADGROUP applies per stream (64 streams, COUNT 2: up to 128
        entries), so with fewer free slots than partitions one pipelined look at every stream's
        group (XINFO GROUPS: how many entries it has not delivered yet, its ``lag``) comes first,
        and then one pipelined XREADGROUP reads only where there is work, as many from each as
        its lag and the slots left allow: an idle poll is one round trip, not one per partition,
        and nothing is claimed that cannot start now (an entry read goes into this consumer's
        pending list until acked or reclaimed). With as many slots as partitions or more, the
        partitions are read in pipelined rounds instead. Either way the read starts where the
        last one stopped (no partition starves). When none has anything new, one blocking
        XREADGROUP over every stream with COUNT 1 waits for the next command: a blocked read is
        woken by one stream and answers with that stream's entry only. (An entry that arrives
        between the look and the blocking read can make that read return one per stream that got
        one; the caller holds those few until it has slots for them.)"""
        if count <= 0:
            return []
        streams = keys.all_outboxes()
        n = len(streams)
        start = self._outbox_cursor
        order = [streams[(start + i) % n] for i in range(n)]
        if count < n:
            out = await self._read_where_lagging(consumer, order, count)
        else:
            self._outbox_cursor = (start + count) % n
            out = await self._read_rounds(consumer, order, count)
        if out or not block_ms:
            return out
        if self.cluster:  # a multi-stream XREADGROUP would be CROSSSLOT on a cluster: poll again later
            await asyncio.sleep(min(block_ms, 200) / 1000)
            return out
        res = await self.r.xreadgroup(keys.OUTBOX_GROUP, consumer, {s: ">" for s in streams}, count=1, block=block_ms)
        for stream, entries in res or []:
            out += self._entries(stream, entries)
        return out

    async def _read_where_lagging(self, consumer: str, order: list[str], count: int) -> list[OutboxEntry]:
        """One look at every group's lag, then one read of at most ``count`` entries in all from
        the streams that have some, in ``order``. A stream whose lag Redis cannot tell, or whose
        group is missing (its NOGROUP then reaches the dispatcher, which re-creates the groups),
        makes the read go round the streams as with many slots (Redis before 7.0 tells no lag)."""
        lags = await outbox_groups(self.r)
        if any(s not in lags or lags[s][1] is None for s in order):
            self._outbox_cursor = (self._outbox_cursor + count) % len(order)
            return await self._read_rounds(consumer, order, count)
        plan: list[tuple[str, int]] = []
        left = count
        for s in order:
            lag = lags[s][1] or 0
            if left and lag:
                plan.append((s, min(lag, left)))
                left -= min(lag, left)
        if not plan:
            return []
        self._outbox_cursor = (self._outbox_cursor + order.index(plan[-1][0]) + 1) % len(order)  # next: after it
        async with self.r.pipeline(transaction=False) as pipe:
            for s, take in plan:
                pipe.xreadgroup(keys.OUTBOX_GROUP, consumer, {s: ">"}, count=take)
            answers = await pipe.execute()
        return [e for res in answers for stream, entries in res or [] for e in self._entries(stream, entries)]

    async def _read_rounds(self, consumer: str, order: list[str], count: int) -> list[OutboxEntry]:
        """Pipelined rounds over the streams, at most ``count`` entries in all: each round asks the
        streams still active for an equal share, a stream that gave all it was asked for stays."""
        active = list(order)  # streams that may hold more
        out: list[OutboxEntry] = []
        while active and len(out) < count:
            want = count - len(out)
            per = max(1, want // len(active))  # entries per stream this round: at most `want` in all
            chunk, active = active[: max(1, want // per)], active[max(1, want // per) :]
            async with self.r.pipeline(transaction=False) as pipe:
                for s in chunk:
                    pipe.xreadgroup(keys.OUTBOX_GROUP, consumer, {s: ">"}, count=per)
                answers = await pipe.execute()
            for s, res in zip(chunk, answers, strict=True):
                got = [e for _stream, entries in res or [] for e in self._entries(_stream, entries)]
                out += got
                if len(got) == per:
                    active.append(s)  # it gave all it was asked for: it may hold more
        return out

    async def outbox_renew(self, consumer: str, entries: list[OutboxEntry]) -> None:
        """Reset the idle time of entries this consumer still works on (XCLAIM ... JUSTID, which
        does not count a delivery): a command whose node runs long, or waits for a slot, is not
        reclaimed by another dispatcher and never reaches ``--max-deliveries`` for waiting."""
        if not entries:
            return
        async with self.r.pipeline(transaction=False) as pipe:
            for e in entries:
                pipe.xclaim(e.stream, keys.OUTBOX_GROUP, consumer, 0, [e.entry_id], justid=True)
            await pipe.execute()

    async def outbox_ack(self, entry: OutboxEntry) -> None:
        """Acknowledge and delete: a handled command's trace lives on in the job's events
        (NODE_STARTED / NODE_COMPLETED), so the stream holds only work still to do."""
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.xack(entry.stream, keys.OUTBOX_GROUP, entry.entry_id)
            pipe.xdel(entry.stream, entry.entry_id)
            await pipe.execute()

    async def outbox_reclaim(self, consumer: str, min_idle_ms: int, count: int = 64) -> list[OutboxEntry]:
        """Take over entries another dispatcher has held for ``min_idle_ms`` without acking, each
        with its delivery count (the consumer group's, this delivery included). One pipelined
        XAUTOCLAIM per partition, then one XPENDING per stream that gave something back."""
        streams = keys.all_outboxes()
        async with self.r.pipeline(transaction=False) as pipe:
            for s in streams:
                pipe.xautoclaim(s, keys.OUTBOX_GROUP, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count)
            claimed = await pipe.execute()
        found = {s: self._entries(s, res[1]) for s, res in zip(streams, claimed, strict=True) if res[1]}
        found = {s: entries for s, entries in found.items() if entries}
        if not found:
            return []
        async with self.r.pipeline(transaction=False) as pipe:
            for s, entries in found.items():
                ids = sorted((e.entry_id for e in entries), key=lambda i: tuple(map(int, i.split("-"))))
                pipe.xpending_range(s, keys.OUTBOX_GROUP, ids[0], ids[-1], len(entries) + 1024, consumer)
            pending = await pipe.execute()
        out: list[OutboxEntry] = []
        for (_s, entries), rows in zip(found.items(), pending, strict=True):
            times = {row["message_id"]: int(row["times_delivered"]) for row in rows}
            for e in entries:
                e.deliveries = times.get(e.entry_id, e.deliveries)
            out += entries
        return out

    async def outbox_pending(self) -> int:
        """Commands delivered but not yet acked, plus commands not yet delivered: one pipelined
        XINFO GROUPS per partition, one round trip."""
        return sum(pending + (lag or 0) for pending, lag in (await outbox_groups(self.r)).values())

    async def outbox_commands(self, job_id: str) -> list[NodeCommand]:
        """The job's commands still in its outbox stream (not yet acknowledged; for checks and tests)."""
        out = []
        for _eid, f in await self.r.xrange(keys.job(job_id).outbox):
            if f.get("job") == job_id:
                out.append(NodeCommand.model_validate_json(f["cmd"]))
        return out

    async def prune_consumers(self, keep: str, idle_ms: int) -> int:
        """Forget outbox consumers (dispatchers of earlier processes) idle for ``idle_ms`` that hold
        nothing: see :func:`prune_idle_consumers`."""
        return await prune_idle_consumers(self.r, keys.all_outboxes(), keys.OUTBOX_GROUP, keep, idle_ms)


async def outbox_groups(r: Any) -> dict[str, tuple[int, int | None]]:
    """Per outbox stream, the dispatchers' group's ``(pending, lag)``: entries delivered and not yet
    acknowledged, and entries not yet delivered (None when Redis cannot tell, after deletions past
    the group's last delivered entry). One pipelined round trip; a stream or group missing (Redis
    came back empty) is left out."""
    streams = keys.all_outboxes()
    async with r.pipeline(transaction=False) as pipe:
        for s in streams:
            pipe.xinfo_groups(s)
        answers = await pipe.execute(raise_on_error=False)
    out: dict[str, tuple[int, int | None]] = {}
    for s, groups in zip(streams, answers, strict=True):
        if isinstance(groups, Exception):
            if not isinstance(groups, ResponseError):
                raise groups
            continue
        for g in groups:
            if g["name"] == keys.OUTBOX_GROUP:
                lag = g.get("lag")
                out[s] = (int(g.get("pending") or 0), None if lag is None else int(lag))
    return out


async def create_groups(r: Any, streams: list[str], group: str) -> None:
    """Create ``group`` on every one of ``streams`` (and the streams), idempotently."""
    for stream in streams:
        try:
            await r.xgroup_create(stream, group, id="0", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise


async def prune_idle_consumers(r: Any, streams: list[str], group: str, keep: str, idle_ms: int) -> int:
    """Delete the consumers of ``group`` on ``streams`` (but ``keep``) idle for ``idle_ms`` that hold
    nothing. A consumer with pending entries is kept: deleting it would drop them from the group's
    pending list; reclaiming moves them first, and a later pass deletes the name."""
    deleted = 0
    for stream in streams:
        try:
            consumers = await r.xinfo_consumers(stream, group)
        except ResponseError:  # no such stream or group yet
            continue
        for c in consumers:
            if c["name"] != keep and int(c["pending"]) == 0 and int(c["idle"]) >= idle_ms:
                await r.xgroup_delconsumer(stream, group, c["name"])
                deleted += 1
    return deleted
