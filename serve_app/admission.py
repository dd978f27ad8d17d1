"""Admission control (SPEC §9): ``POST /jobs`` is refused with 429 ``BACKLOG_FULL`` while the outbox
backlog (node commands not yet started) exceeds ``--max-backlog``.

The backlog is measured cheaply: the length of every outbox partition (XLEN; a command is deleted
when its node is done, so a stream holds only work not yet finished), one pipelined round trip
over the partitions, cached for ``ttl_s`` so a burst of submissions costs one measurement a
second, never a walk over jobs. It counts the commands being run too (at most dispatchers x
concurrency): a dispatcher that has read a command may still hold it unstarted, and the group's
pending count cannot tell the two apart, so "delivered" is no proof of "started".
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from statecore import errors, keys
from statecore.store import Store


async def measure_backlog(store: Store) -> int:
    """Commands in the outbox not yet finished (queued, or held or run by a dispatcher), over every partition."""
    async with store.r.pipeline(transaction=False) as pipe:
        for s in keys.all_outboxes():
            pipe.xlen(s)
        lengths: list[Any] = await pipe.execute()
    return sum(int(n) for n in lengths)


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
                f"{n} node commands are queued or running (limit {self.max_backlog}); submit again later",
                backlog=n,
                max_backlog=self.max_backlog,
            )
