"""Admission control (docs/protocol.md § Error codes, BACKLOG_FULL): ``POST /jobs`` is refused with
429 while the backlog (node commands queued and not yet started) exceeds ``--max-backlog``.

The backlog is the ``queued`` index of every partition (a node leaves it when the executor doing
the work starts it, not when a dispatcher reads or hands it to Serve): one pipelined round trip
over the partitions (``Store.backlog``), cached for ``ttl_s`` so a burst of submissions costs one
measurement a second, never a walk over jobs; each job admitted meanwhile counts one more, so a
burst faster than the measurement is still refused once it passes the limit. Running nodes do
not count: they are bounded by the deployments' capacity (serve_app.work.capacity).
"""

from __future__ import annotations

import asyncio
import time

from hitl_review.statecore import errors
from hitl_review.statecore.store import Store


async def measure_backlog(store: Store) -> int:
    """Node commands queued and not yet started, over every partition."""
    queued, _oldest_s = await store.backlog()
    return queued


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
                f"{n} node commands are queued and not yet started (limit {self.max_backlog}); submit again later",
                backlog=n,
                max_backlog=self.max_backlog,
            )
        self._value += 1  # its DETECT_SUBJECTS command joins the backlog until the next measurement
