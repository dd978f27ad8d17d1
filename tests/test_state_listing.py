"""Paging through ``GET /jobs`` is an exact k-way merge over the partitions.

Jobs are really created through the store (and some really detected or cancelled), but
crowded into a few partitions in random proportions, so each page has to merge partitions
whose rows interleave unevenly. Paging with a random ``limit`` must return every job the
caller may see exactly once, in the listing's order, whatever the owner and status filter.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hitl_review.statecore import keys
from hitl_review.statecore.errors import InvalidRequest
from hitl_review.statecore.listing import _IndexReader
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES, report

IMAGE = ImageRef(sha256="b" * 64, width=640, height=480, url="/api/v1/artifacts/img_" + "b" * 16 + ".png")
OWNERS = ("alice", "bob", "carol")
_counter = itertools.count()


def _key_in_partition(owner: str, p: int) -> str:
    """An idempotency key whose creation record (and so the job) falls in partition ``p``."""
    while True:
        key = f"k{next(_counter)}"
        if keys.create_idem_partition(owner, key) == p:
            return key


# A job: (owner index, partition slot, fate) where fate 0 = detecting, 1 = waiting, 2 = cancelled.
JOBS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=90)


async def _populate(store: Store, jobs: list[tuple[int, int, int]], parts: list[int]) -> dict[str, tuple[str, str]]:
    made: dict[str, tuple[str, str]] = {}
    for owner_i, slot, fate in jobs:
        owner = OWNERS[owner_i]
        reply = await store.create_job(owner, IMAGE, _key_in_partition(owner, parts[slot]))
        jid = reply.job_id
        if fate == 1:
            assert await report(store, jid, {"boxes": THREE_BOXES}) == "OK"
        elif fate == 2:
            await store.cancel(jid, "ops")
        made[jid] = (owner, (await store.get(jid)).status.value)
    return made


async def _page_all(store: Store, limit: int, *, submitter: str | None, status: str | None) -> list[str]:
    seen: list[str] = []
    cursor = None
    for _ in range(500):
        page, cursor = await store.list_jobs(limit=limit, cursor=cursor, submitter=submitter, status=status)
        assert len(page) <= limit
        seen += [j.job_id for j in page]
        if cursor is None:
            return seen
    raise AssertionError("paging did not end")


def _expected_order(store_rows: list[tuple[float, str]], ascending: bool) -> list[str]:
    rows = sorted(store_rows, reverse=not ascending)
    return [jid for _, jid in rows]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    jobs=JOBS,
    limit=st.integers(1, 7),
    batch=st.integers(1, 8),
    parts=st.lists(st.integers(0, keys.PARTITIONS - 1), min_size=3, max_size=3),
)
def test_paging_returns_every_matching_job_once_in_order(redis_server, jobs, limit, batch, parts):
    """``batch`` shrinks the per-partition fetch so that many-batch merges and rows sharing a
    millisecond across a batch boundary are common, not only with thousands of jobs."""

    async def run() -> None:
        store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600))
        try:
            await store.r.flushdb()
            await store.ensure_groups()
            made = await _populate(store, jobs, parts)
            scores = {}
            for jid in made:
                jk = keys.job(jid)
                scores[jid] = await store.r.zscore(jk.jobs, jid)
            cases: list[tuple[str | None, str | None]] = [
                (None, None),
                ("bob", None),
                (None, "CANCELLED"),
                ("alice", "DETECTING"),
                (None, "WAITING"),
                ("carol", "WAITING_USER_SELECTION"),
            ]
            for submitter, status in cases:
                if status and status.startswith("WAITING"):
                    rows = [(await store.r.zscore(keys.job(j).waiting, j), j) for j in made]
                    rows = [(s, j) for s, j in rows if s is not None and made[j][0] == (submitter or made[j][0])]
                    want = _expected_order(rows, ascending=True)
                else:
                    rows = [
                        (scores[j], j)
                        for j, (owner, stt) in made.items()
                        if (submitter is None or owner == submitter) and (status is None or stt == status)
                    ]
                    want = _expected_order(rows, ascending=False)
                got = await _page_all(store, limit, submitter=submitter, status=status)
                assert len(got) == len(set(got)), f"a job was listed twice ({submitter}, {status})"
                assert got == want, f"submitter={submitter} status={status} limit={limit}"
        finally:
            await store.close()

    saved = _IndexReader.BATCH
    _IndexReader.BATCH = batch
    try:
        asyncio.run(run())
    finally:
        _IndexReader.BATCH = saved


async def test_a_crowded_partition_does_not_hide_a_submitters_jobs(store):
    """The shape of the original defect: an old job alone in one partition, and one owner's jobs
    behind many newer ones of another owner in a second partition. A pass that took the newest
    rows of each partition used to continue below the oldest row of any partition, never reading
    the crowded partition's rows in between."""
    crowded, sparse = 5, 41
    await store.create_job("bob", IMAGE, _key_in_partition("bob", sparse))
    await asyncio.sleep(0.01)
    mine = []
    for i in range(60):
        if i % 8 == 0 and i < 40:
            mine.append((await store.create_job("alice", IMAGE, _key_in_partition("alice", crowded))).job_id)
        await store.create_job("bob", IMAGE, _key_in_partition("bob", crowded))
    got = await _page_all(store, 1, submitter="alice", status=None)
    assert sorted(got) == sorted(mine)


async def test_listings_at_once_share_a_small_connection_pool(redis_server):
    """Reviewers' queues poll the listing all the time. A listing reads 64 partitions, and each read
    used to take its own pooled connection, so a few listings at once ran out a pool of 256 (503
    STORE_UNAVAILABLE on the UI's calls and on POST /jobs). Now one listing takes one connection:
    twelve listings at once, filtered by claims and by status, share a pool of eight."""
    store = Store.from_url(redis_server.url, StoreConfig(retention_s=3600), max_connections=8)
    try:
        await store.r.flushdb()
        await store.ensure_groups()
        made = await _populate(store, [(i % 3, i % 3, i % 3) for i in range(30)], [3, 17, 40])
        waiting = sorted(j for j, (_, status) in made.items() if status == "WAITING_USER_SELECTION")
        pages = await asyncio.gather(
            *(store.list_jobs(status="WAITING", unclaimed_for=f"rev{i}", limit=50) for i in range(6)),
            *(store.list_jobs(status="CANCELLED", limit=50) for _ in range(6)),
        )
        for jobs, _ in pages[:6]:
            assert sorted(j.job_id for j in jobs) == waiting
        for jobs, _ in pages[6:]:
            assert len(jobs) == sum(status == "CANCELLED" for _, status in made.values()) == 10
    finally:
        await store.close()


@pytest.mark.parametrize(
    "cursor", ["1.2.3:x", "abc", ":job_1", "12:", "12:job 1", "-1:job_a", "1e9:job_a", "9" * 40 + ":job_a"]
)
async def test_a_malformed_cursor_is_invalid_request(store, cursor):
    with pytest.raises(InvalidRequest) as ei:
        await store.list_jobs(limit=5, cursor=cursor)
    assert ei.value.details.get("field") == "cursor"
