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
