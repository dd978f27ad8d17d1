"""The outbox: node commands in one Redis stream per partition, read by the dispatchers through a
consumer group (docs/protocol.md § Executors and the outbox). A mixin of :class:`statecore.store.Store`.
"""

from __future__ import annotations

import asyncio
import math
import time
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
    view_ttl_ms: int = 50  # how long what a look or a blocking read saw of the streams is trusted
    _lane_turn: int = 0  # which lane goes first in the next read
    _cursors: dict[str, int] | None = None  # per lane: the partition its next read starts at
    # Per stream, the entries not yet delivered as last seen (less what was read since), and when
    # that was true of all of them (time.monotonic()): see outbox_read.
    _view: dict[str, int] | None = None
    _view_at: float = 0.0
    _seen_pending: dict[str, tuple[float, int]] | None = None  # per stream: (when, pending) at its last look

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

        A pipelined look at the streams' group (XINFO GROUPS: how many entries it has not delivered
        yet, its ``lag``) tells where the work is; then ``count`` is shared among the lanes with
        work, one at a time in turn (a lane's backlog never takes the slots of another lane's
        commands), and one pipelined XREADGROUP reads, in each lane, as many from each stream as its
        lag and the lane's share allow: nothing is claimed that cannot start now (an entry read goes
        into this consumer's pending list until acked or reclaimed). Each lane's read starts at the
        partition where its last one stopped, and the lanes take turns going first (none starves).
        When none has anything new, one blocking XREADGROUP over the streams of every lane with free
        slots and COUNT 1 waits for the next command: a blocked read is woken by one stream and
        answers with that stream's entry only. While a lane with work has no free slot, that wait is
        short (``held_block_ms``): its slots free up without a write to Redis.

        The look is not repeated every round (it is one command per stream, 192): what it saw is
        kept for ``view_ttl_ms``, less what each read took (a stream that gave less than asked is
        empty), and a blocking read renews it: timed out, its streams had nothing new; woken, only
        the streams that answered may hold more. So an idle dispatcher sends one blocking read a
        wait, a command that wakes it one look at its stream, and a burst one look for the reads of
        that long. The look comes again when a lane with free slots has a stream not seen (its slots
        just freed, a woken stream) or the view is older than ``view_ttl_ms`` (the loop was away:
        a blocking read on streams that got entries meanwhile would take one from each). A lane
        without free slots is looked at only with the others; unseen, it counts as holding work
        (the short wait). A command queued meanwhile in a lane the view holds empty waits for the
        next blocking read, or at most ``view_ttl_ms`` while the view's work is read. (An entry
        that arrives between the look and the blocking read can make that read return one per
        stream that got one; the caller holds those few until it has slots for them.) A read that
        does not block (``block_ms`` 0) looks every time: no blocking read follows it to see what
        arrived since the view was taken."""
        budget = {lane: min(count, count if lanes is None else lanes.get(lane, 0)) for lane in keys.LANES}
        if count <= 0 or not any(n > 0 for n in budget.values()):
            return []
        first = self._lane_turn % len(keys.LANES)
        self._lane_turn += 1
        turn = [keys.LANES[(first + i) % len(keys.LANES)] for i in range(len(keys.LANES))]
        try:
            return await self._read(consumer, turn, budget, count, block_ms)
        except BaseException:
            self._view = None  # Redis away or emptied, or cancelled mid-read: look again
            raise

    async def _read(
        self, consumer: str, turn: list[str], budget: Mapping[str, int], count: int, block_ms: int
    ) -> list[OutboxEntry]:
        streams = [s for lane in turn if budget[lane] > 0 for s in keys.lane_outboxes(lane)]
        if not block_ms or self._view is None or (time.monotonic() - self._view_at) * 1000 > self.view_ttl_ms:
            self._view = {}
        unseen = [s for s in streams if s not in self._view]
        if unseen and not await self._look(unseen if self._view else keys.all_outboxes()):
            self._view = None
            out, held = await self._read_each_lane(consumer, turn, budget, count), False
        else:
            view = self._view
            held = any(budget[lane] <= 0 and any(view.get(s, 1) > 0 for s in keys.lane_outboxes(lane)) for lane in turn)
            out = await self._read_where_lagging(consumer, turn, budget, count, view)
        if out or not block_ms:
            return out
        block_ms = min(block_ms, self.held_block_ms) if held else block_ms
        if self.cluster:  # a multi-stream XREADGROUP would be CROSSSLOT on a cluster: poll again later
            await asyncio.sleep(min(block_ms, 200) / 1000)
            return out
        res = await self.r.xreadgroup(keys.OUTBOX_GROUP, consumer, {s: ">" for s in streams}, count=1, block=block_ms)
        woken = {stream for stream, _entries in res or []}
        self._view = {s: 0 for s in streams if s not in woken}  # nothing new there till now
        self._view_at = time.monotonic()
        for stream, entries in res or []:
            out += self._entries(stream, entries)
        return out

    async def _look(self, streams: list[str]) -> bool:
        """XINFO GROUPS on ``streams``: their lags into the view (all of it when ``streams`` is every
        stream), their pending counts for the reclaim. False where Redis cannot tell a lag (before
        7.0, or after deletions past the group's last delivered entry) or a stream or its group is
        missing."""
        at = time.monotonic()
        groups = await outbox_groups(self.r, streams)
        seen = self._seen_pending = self._seen_pending or {}
        for s, (pending, _lag) in groups.items():
            seen[s] = (at, pending)
        if len(streams) == len(keys.all_outboxes()):
            self._view, self._view_at = {}, at
        if self._view is not None:
            self._view.update({s: lag for s, (_pending, lag) in groups.items() if lag is not None})
        return all(groups.get(s, (0, None))[1] is not None for s in streams)

    def _order(self, lane: str) -> list[str]:
        """The lane's streams, starting at the partition where its last read stopped."""
        streams = keys.lane_outboxes(lane)
        start = self._outbox_cursors.get(lane, 0) % len(streams)
        return streams[start:] + streams[:start]

    async def _read_where_lagging(
        self, consumer: str, turn: list[str], budget: Mapping[str, int], count: int, lag: dict[str, int]
    ) -> list[OutboxEntry]:
        """One read of at most ``count`` entries in all, shared among the lanes in ``turn`` one entry
        at a time (each up to its budget and its ``lag``, the view, which loses what is read), from
        the streams that have some."""
        want = {lane: min(budget[lane], sum(lag.get(s, 0) for s in keys.lane_outboxes(lane))) for lane in turn}
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
                if left and lag.get(s, 0):
                    plan.append((s, min(lag[s], left)))
                    left -= min(lag[s], left)
                    last = order.index(s)
            if share[lane]:  # next time this lane starts after the last stream read
                self._outbox_cursors[lane] = self._outbox_cursors.get(lane, 0) + last + 1
        if not plan:
            return []
        async with self.r.pipeline(transaction=False) as pipe:
            for s, take in plan:
                pipe.xreadgroup(keys.OUTBOX_GROUP, consumer, {s: ">"}, count=take)
            answers = await pipe.execute()
        out: list[OutboxEntry] = []
        for (s, take), res in zip(plan, answers, strict=True):
            got = sum(len(entries) for _stream, entries in res or [])
            lag[s] = lag[s] - take if got == take else 0  # less than asked: another dispatcher took the rest
            out += [e for stream, entries in res or [] for e in self._entries(stream, entries)]
        return out

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
        XAUTOCLAIM per stream where a look (outbox_read's, or one here for the streams not looked
        at for ``min_idle_ms``) saw pending entries, then one XPENDING per stream that gave
        something back. A stream without pending entries at a look less than ``min_idle_ms`` ago
        has none idle that long now: an entry delivered since is younger."""
        now = time.monotonic()
        seen = self._seen_pending or {}
        stale = [s for s in keys.all_outboxes() if (now - seen.get(s, (-math.inf, 0))[0]) * 1000 >= min_idle_ms]
        try:
            if stale:
                await self._look(stale)
            seen = self._seen_pending or {}
            streams = [s for s in keys.all_outboxes() if seen.get(s, (0, 1))[1] > 0]  # unseen: missing, asked
            return await self._reclaim(consumer, streams, min_idle_ms, count)
        except BaseException:
            self._seen_pending = None
            raise

    async def _reclaim(self, consumer: str, streams: list[str], min_idle_ms: int, count: int) -> list[OutboxEntry]:
        if not streams:
            return []
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


async def outbox_groups(r: Any, streams: list[str] | None = None) -> dict[str, tuple[int, int | None]]:
    """Per outbox stream, the dispatchers' group's ``(pending, lag)``: entries delivered and not yet
    acknowledged, and entries not yet delivered (None when Redis cannot tell, after deletions past
    the group's last delivered entry). One pipelined round trip; a stream or group missing (Redis
    came back empty) is left out. Every outbox stream, or ``streams``."""
    streams = keys.all_outboxes() if streams is None else streams
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
    pending list; reclaiming moves them first, and a later pass deletes the name. One pipelined
    look at every stream (a look per stream, one after another, was 192 round trips every inspector
    pass), and one for the deletions when there are any."""
    async with r.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.xinfo_consumers(stream, group)
        answers = await pipe.execute(raise_on_error=False)
    gone: list[tuple[str, str]] = []
    for stream, consumers in zip(streams, answers, strict=True):
        if isinstance(consumers, Exception):
            if not isinstance(consumers, ResponseError):  # no such stream or group yet: nothing to prune
                raise consumers
            continue
        gone += [
            (stream, c["name"])
            for c in consumers
            if c["name"] != keep and int(c["pending"]) == 0 and int(c["idle"]) >= idle_ms
        ]
    if gone:
        async with r.pipeline(transaction=False) as pipe:
            for stream, name in gone:
                pipe.xgroup_delconsumer(stream, group, name)
            await pipe.execute()
    return len(gone)
