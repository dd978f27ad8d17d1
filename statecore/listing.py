"""Listing jobs across the 64 partitions as one exact, paged order.

Each partition's index (``jobs``: newest first; ``waiting``: oldest pause first) is read in
batches strictly after a position; the heads are merged with a heap; rows are examined in the
listing's total order (score, then job id). So a page is exactly the next ``limit`` matching jobs,
and the cursor (the last row returned, ``<score>:<job_id>``) is a position in that one order,
valid for every partition, however unevenly the partitions fill.
"""

from __future__ import annotations

import functools
import heapq
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from . import decide, errors, keys
from .models import ClaimView, JobFlag, JobSummary
from .quorum import votes_of
from .states import is_waiting

CURSOR_RE = re.compile(r"^([0-9]{1,16}):([A-Za-z0-9_]{1,64})$")


class _Row(NamedTuple):
    score: int
    job_id: str


def parse_cursor(cursor: str) -> _Row:
    """``<score>:<job_id>`` as :meth:`Store.list_jobs` writes it; anything else is a 400."""
    m = CURSOR_RE.match(cursor)
    if not m:
        raise errors.InvalidRequest("malformed cursor: pass back the next_cursor of a previous page", field="cursor")
    return _Row(int(m.group(1)), m.group(2))


@functools.total_ordering
class _Desc:
    """A job id compared backwards, so newest-first rows sort ascending in a min-heap."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __lt__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.value > other.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


class _IndexReader:
    """One partition's index rows strictly after a position, in listing order, fetched in batches.

    Ascending (the review queue): (score, job id) ascending, as ZRANGEBYSCORE orders them.
    Descending (newest first): (score, job id) descending, as ZREVRANGEBYSCORE does. Each batch
    starts at the last row's score (inclusive) and drops rows at or before the last row by
    comparison, so rows sharing a score are neither skipped nor repeated, even when the index
    changes between batches."""

    BATCH = 64

    def __init__(self, r: Any, key: str, ascending: bool, after: _Row | None) -> None:
        self.r, self.key, self.ascending = r, key, ascending
        self.last = after
        self.ties = 0  # rows already seen at ``last.score``: fetched again, then dropped
        self.rows: deque[_Row] = deque()
        self.exhausted = False

    def _after_last(self, row: _Row) -> bool:
        if self.last is None:
            return True
        if self.ascending:
            return (row.score, row.job_id) > (self.last.score, self.last.job_id)
        return (row.score, row.job_id) < (self.last.score, self.last.job_id)

    def order_key(self) -> tuple[int, Any]:
        head = self.rows[0]
        return (head.score, head.job_id) if self.ascending else (-head.score, _Desc(head.job_id))

    def command(self, target: Any) -> Any:
        """The next batch's read, sent to ``target``: the client (a coroutine) or a pipeline (queued)."""
        num = self.BATCH + self.ties
        if self.ascending:
            lo = self.last.score if self.last else "-inf"
            return target.zrangebyscore(self.key, lo, "+inf", start=0, num=num, withscores=True)
        hi = self.last.score if self.last else "+inf"
        return target.zrevrangebyscore(self.key, hi, "-inf", start=0, num=num, withscores=True)

    def take(self, raw: list[tuple[str, float]]) -> bool:
        """Keep a batch's new rows; False when every row lay at or before the cursor (look further)."""
        num = self.BATCH + self.ties
        self.exhausted = len(raw) < num
        fresh = [row for row in (_Row(int(s), j) for j, s in raw) if self._after_last(row)]
        for row in fresh:
            self.ties = self.ties + 1 if self.last is not None and row.score == self.last.score else 1
            self.last = row
        self.rows.extend(fresh)
        if fresh or self.exhausted:
            return True
        # Every fetched row shares the cursor's score and lies before it: look further.
        self.ties += self.BATCH
        return False

    async def fill(self) -> None:
        """Fetch until at least one new row arrives or the index is exhausted."""
        while not self.take(await self.command(self.r)):
            pass


async def fill_all(r: Any, readers: list[_IndexReader]) -> None:
    """Every partition's first batch in one pipeline: one pooled connection and one round trip per
    listing (per node on a cluster). One read per partition at once took 64 connections per listing,
    and a few listings at once (reviewers' queues polling) ran the pool out: 503 STORE_UNAVAILABLE."""
    async with r.pipeline(transaction=False) as pipe:
        for rd in readers:
            rd.command(pipe)
        raws = await pipe.execute()
    for rd, raw in zip(readers, raws, strict=True):
        if not rd.take(raw):
            await rd.fill()


async def list_jobs(
    r: Any,
    read_metas: Callable[[list[str]], Awaitable[list[dict[str, str]]]],
    *,
    submitter: str | None,
    status: str | None,
    limit: int,
    cursor: str | None,
    read_claims: Callable[[list[str]], Awaitable[list[ClaimView | None]]] | None = None,
    unclaimed_for: str | None = None,
    read_notes: Callable[[list[str], str | None], Awaitable[list[tuple[JobFlag | None, bool]]]] | None = None,
    flagged: bool | None = None,
) -> tuple[list[JobSummary], str | None]:
    """Newest first over all partitions; with a waiting ``status`` (or ``WAITING``), the review
    queue, oldest pause first.

    An exact k-way merge: each partition's index is read in order after the cursor, the heads
    are merged, and rows are examined strictly in the listing's total order (score, then job
    id), so a page is exactly the next ``limit`` matching jobs and the cursor (the last row
    returned, ``<score>:<job_id>``) is a position in that order, valid for every partition.

    ``read_claims`` gives each summary its review claim (docs/protocol.md § Claims); with
    ``unclaimed_for`` (the next job for that reviewer), a job claimed by another reviewer does not
    match, nor a quorum job whose pause already has that reviewer's vote (docs/protocol.md § Quorum).
    """
    waiting_queue = status == "WAITING" or (status is not None and is_waiting(status))
    after = parse_cursor(cursor) if cursor else None
    index = keys.waiting if waiting_queue else keys.jobs
    readers = [_IndexReader(r, index(p), waiting_queue, after) for p in range(keys.PARTITIONS)]
    await fill_all(r, readers)
    heap: list[tuple[Any, int]] = [(rd.order_key(), i) for i, rd in enumerate(readers) if rd.rows]
    heapq.heapify(heap)
    filtered = (
        submitter is not None
        or (status is not None and status != "WAITING")
        or unclaimed_for is not None
        or flagged is not None
    )
    out: list[tuple[_Row, JobSummary]] = []
    more = False
    while heap and len(out) < limit:
        need = limit - len(out)
        chunk: list[_Row] = []
        while heap and len(chunk) < (max(need, 32) if filtered else need):
            _, i = heapq.heappop(heap)
            rd = readers[i]
            chunk.append(rd.rows.popleft())
            if not rd.rows and not rd.exhausted:
                await rd.fill()
            if rd.rows:
                heapq.heappush(heap, (rd.order_key(), i))
        ids = [row.job_id for row in chunk]
        metas = await read_metas(ids)
        claims = await read_claims(ids) if read_claims is not None else [None] * len(chunk)
        notes = await read_notes(ids, unclaimed_for) if read_notes is not None else [(None, False)] * len(chunk)
        for n, (row, meta, claim, (flag, skipped)) in enumerate(zip(chunk, metas, claims, notes, strict=True)):
            if not meta:  # expired after its retention; the inspector prunes the index too
                if not waiting_queue:
                    await r.zrem(keys.jobs(keys.partition_of(row.job_id)), row.job_id)
                continue
            st = decide.JobState.from_meta(meta)
            if submitter is not None and st.submitter != submitter:
                continue
            if status and status != "WAITING" and st.status != status:
                continue
            if unclaimed_for is not None and claim is not None and claim.reviewer != unclaimed_for:
                continue
            if unclaimed_for is not None and st.votes and unclaimed_for in votes_of(st.votes):
                continue  # this reviewer's vote is in: the quorum waits for other reviewers
            if unclaimed_for is not None and skipped:
                continue  # this reviewer skipped it a moment ago (docs/protocol.md § Flags, skips and comments)
            if flagged is not None and (flag is not None) != flagged:
                continue
            summary = st.summary()
            summary.claim = claim
            summary.flag = flag
            out.append((row, summary))
            if len(out) == limit:
                more = n + 1 < len(chunk)
                break
    more = more or bool(heap)
    nxt = f"{out[-1][0].score}:{out[-1][0].job_id}" if out and len(out) == limit and more else None
    return [summary for _, summary in out], nxt
