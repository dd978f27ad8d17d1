"""The outbox: node commands in one Redis stream per partition, read by the dispatchers through a
consumer group (docs/protocol.md § Executors and the outbox). A mixin of :class:`statecore.store.Store`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from . import keys
from .models import NodeCommand
from .states import NodeType


@dataclass
class OutboxEntry:
    stream: str
    entry_id: str
    command: NodeCommand
    deliveries: int = 1


class OutboxMixin:
    r: Any
    cluster: bool
    _scripts: dict[str, Any]
    held_block_ms: int = 50  # the longest blocking read while a lane with work waits for free slots
    _lane_turn: int = 0  # which lane goes first in the next read
    _cursors: dict[str, int] | None = None  # per lane: the partition its next read starts at

    @property
    def _outbox_cursors(self) -> dict[str, int]:
        if self._cursors is None:
            self._cursors = {}
        return self._cursors

    @staticmethod
    def _entries(stream: str, entries: list[Any]) -> list[OutboxEntry]:
        out = []
        for eid, fields in entries:
            if fields is None:  # deleted while pending
                continue
            out.append(OutboxEntry(stream, eid, NodeCommand.model_validate_json(fields["cmd"])))
        return out

    async def outbox_read(
        self, consumer: str, count: int = 16, block_ms: int = 1000, lanes: Mapping[str, int] | None = None
    ) -> list[OutboxEntry]:
        """Up to ``count`` new commands for this consumer (consumer group: each entry goes to one
        dispatcher), and from each lane (``keys.LANES``) at most what ``lanes`` allows it (its
        deployment's free slots; a lane ``lanes`` leaves out is not read, ``lanes`` None: every lane
        up to ``count``), and no more: a dispatcher reads only what it can start now, the rest stays
        in the outbox for admission control to count and for other dispatchers to take.

        One pipelined look at every stream's group (XINFO GROUPS: how many entries it has not
        delivered yet, its ``lag``) comes first; then ``count`` is shared among the lanes with work,
        one at a time in turn (a lane's backlog never takes the slots of another lane's commands),
        and one pipelined XREADGROUP reads, in each lane, where there is work, as many from each
        stream as its lag and the lane's share allow: an idle poll is one round trip, not one per
        stream, and nothing is claimed that cannot start now (an entry read goes into this
        consumer's pending list until acked or reclaimed). Each lane's read starts at the partition
        where its last one stopped, and the lanes take turns going first (none starves). When none
        has anything new, one blocking XREADGROUP over the streams of every lane with free slots
        and COUNT 1 waits for the next command: a blocked read is woken by one stream and answers
        with that stream's entry only. While a lane with work has no free slot, that wait is short
        (``held_block_ms``): its slots free up without a write to Redis. (An entry that arrives
        between the look and the blocking read can make that read return one per stream that got
        one; the caller holds those few until it has slots for them.)"""
        budget = {lane: min(count, count if lanes is None else lanes.get(lane, 0)) for lane in keys.LANES}
        if count <= 0 or not any(n > 0 for n in budget.values()):
            return []
        first = self._lane_turn % len(keys.LANES)
        self._lane_turn += 1
        turn = [keys.LANES[(first + i) % len(keys.LANES)] for i in range(len(keys.LANES))]
        lags = await outbox_groups(self.r)
        if any(lags.get(s, (0, None))[1] is None for s in keys.all_outboxes()):
            out, held = await self._read_each_lane(consumer, turn, budget, count), False
        else:
            out, held = await self._read_where_lagging(consumer, turn, budget, count, lags)
        if out or not block_ms:
            return out
        block_ms = min(block_ms, self.held_block_ms) if held else block_ms
        if self.cluster:  # a multi-stream XREADGROUP would be CROSSSLOT on a cluster: poll again later
            await asyncio.sleep(min(block_ms, 200) / 1000)
            return out
        streams = [s for lane in turn if budget[lane] > 0 for s in keys.lane_outboxes(lane)]
        res = await self.r.xreadgroup(keys.OUTBOX_GROUP, consumer, {s: ">" for s in streams}, count=1, block=block_ms)
        for stream, entries in res or []:
            out += self._entries(stream, entries)
        return out

    def _order(self, lane: str) -> list[str]:
        """The lane's streams, starting at the partition where its last read stopped."""
        streams = keys.lane_outboxes(lane)
        start = self._outbox_cursors.get(lane, 0) % len(streams)
        return streams[start:] + streams[:start]

    async def _read_where_lagging(
        self,
        consumer: str,
        turn: list[str],
        budget: Mapping[str, int],
        count: int,
        lags: Mapping[str, tuple[int, int | None]],
    ) -> tuple[list[OutboxEntry], bool]:
        """One read of at most ``count`` entries in all, shared among the lanes in ``turn`` one entry
        at a time (each up to its budget and its lag), from the streams that have some; and whether
        a lane with work was held back for want of free slots."""
        lag = {s: lags[s][1] or 0 for s in keys.all_outboxes()}
        want = {lane: min(budget[lane], sum(lag[s] for s in keys.lane_outboxes(lane))) for lane in turn}
        held = any(budget[lane] <= 0 < sum(lag[s] for s in keys.lane_outboxes(lane)) for lane in turn)
        share = dict.fromkeys(turn, 0)
        left = count
        while left and any(share[lane] < want[lane] for lane in turn):
            for lane in turn:
                if left and share[lane] < want[lane]:
                    share[lane] += 1
                    left -= 1
        plan: list[tuple[str, int]] = []
        for lane in turn:
            order, left, last = self._order(lane), share[lane], 0
            for s in order:
                if left and lag[s]:
                    plan.append((s, min(lag[s], left)))
                    left -= min(lag[s], left)
                    last = order.index(s)
            if share[lane]:  # next time this lane starts after the last stream read
                self._outbox_cursors[lane] = self._outbox_cursors.get(lane, 0) + last + 1
        if not plan:
            return [], held
        async with self.r.pipeline(transaction=False) as pipe:
            for s, take in plan:
                pipe.xreadgroup(keys.OUTBOX_GROUP, consumer, {s: ">"}, count=take)
            answers = await pipe.execute()
        return [e for res in answers for stream, entries in res or [] for e in self._entries(stream, entries)], held

    async def _read_each_lane(
        self, consumer: str, turn: list[str], budget: Mapping[str, int], count: int
    ) -> list[OutboxEntry]:
        """Without every stream's lag (Redis before 7.0 tells none; a stream or group missing, whose
        NOGROUP then reaches the dispatcher, which re-creates the groups): each lane in turn read in
        rounds, up to its budget and what ``count`` leaves."""
        out: list[OutboxEntry] = []
        for lane in turn:
            want = min(budget[lane], count - len(out))
            if want > 0:
                order = self._order(lane)
                self._outbox_cursors[lane] = self._outbox_cursors.get(lane, 0) + want
                out += await self._read_rounds(consumer, order, want)
        return out

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

    async def outbox_sort(self, chunk: int = 1000) -> int:
        """Move the commands of other lanes that an earlier version queued in a partition's one stream
        (the detect lane's now) and no dispatcher took yet to their lanes (lua/outbox_sort.lua, up to
        ``chunk`` entries a step), so a segmentation queued before an upgrade does not wait behind the
        detections queued before it either; what was delivered stays, pending or acknowledged, and is
        run or reclaimed there. Run where the groups are ensured (a dispatcher's start); how many moved."""
        lags = await outbox_groups(self.r)  # one look: a partition with nothing undelivered is skipped
        streams_of = {p: keys.partition_outboxes(p) for p in range(keys.PARTITIONS)}
        moved = 0
        for p, streams in streams_of.items():
            if lags.get(streams[0], (0, None))[1] == 0:
                continue
            lanes = [(t.value, streams.index(keys.outbox(p, keys.lane_of(t.value))) + 1) for t in NodeType]
            moves = [x for t, i in lanes if i > 1 for x in (t, i)]
            after = "0-0"
            while True:
                n, after, seen = await self._scripts["outbox_sort"](
                    keys=streams, args=[keys.OUTBOX_GROUP, after, chunk, *moves]
                )
                moved += int(n)
                if int(seen) < chunk:
                    break
        return moved

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
        """The job's commands still in its partition's outbox streams (not yet acknowledged; for checks
        and tests), oldest first whichever lane holds them."""
        found = []
        for stream in keys.job(job_id).outboxes:
            for eid, f in await self.r.xrange(stream):
                if f.get("job") == job_id:
                    found.append((tuple(map(int, eid.split("-"))), NodeCommand.model_validate_json(f["cmd"])))
        return [cmd for _at, cmd in sorted(found, key=lambda x: x[0])]

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
