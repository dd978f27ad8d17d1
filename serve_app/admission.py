"""Admission control (SPEC §9): ``POST /jobs`` is refused with 429 ``BACKLOG_FULL`` while the outbox
backlog (node commands not yet started) exceeds ``--max-backlog``.

The backlog is measured cheaply: per outbox partition its length (XLEN: acknowledged commands are
deleted, so the stream holds only work still to do) less what dispatchers already took (the
group's pending count, XINFO GROUPS), one pipelined round trip over the partitions, cached for
``ttl_s`` so a burst of submissions costs one measurement a second, never a walk over jobs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from statecore import errors, keys
from statecore.store import Store


async def measure_backlog(store: Store) -> int:
    """Commands in the outbox that no dispatcher has taken yet, over every partition."""
    streams = list(keys.all_outboxes())
    async with store.r.pipeline(transaction=False) as pipe:
        for s in streams:
            pipe.xlen(s)
            pipe.xinfo_groups(s)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    total = 0
    for i in range(len(streams)):
        length, groups = replies[2 * i], replies[2 * i + 1]
        if isinstance(length, Exception):
            raise length
        taken = 0
        if not isinstance(groups, Exception):  # no stream or no group yet: nothing taken
            taken = sum(int(g.get("pending") or 0) for g in groups if g.get("name") == keys.OUTBOX_GROUP)
        total += max(0, int(length) - taken)
    return total


class Admission:
    def __init__(self, store: Store, max_backlog: int, ttl_s: float = 1.0) -> None:
        self.store = store
        self.max_backlog = max_backlog
        self.ttl_s = ttl_s
        self._value = 0
        self._at = float("-inf")
        self._lock = asyncio.Lock()

    async def backlog(self) -> int:
        """The backlog, measured at most once per ``ttl_s`` (concurrent callers share one measurement)."""
        if time.monotonic() - self._at < self.ttl_s:
            return self._value
        async with self._lock:
            if time.monotonic() - self._at >= self.ttl_s:
                self._value = await measure_backlog(self.store)
                self._at = time.monotonic()
        return self._value

    async def admit_job(self) -> None:
        """Raise ``BacklogFull`` when a new job would queue behind more than ``max_backlog`` commands."""
        if self.max_backlog <= 0:
            return
        n = await self.backlog()
        if n > self.max_backlog:
            raise errors.BacklogFull(
                f"{n} node commands are waiting to start (limit {self.max_backlog}); submit again later",
                backlog=n,
                max_backlog=self.max_backlog,
            )
