"""What has no TTL stays bounded (real redis-server): the listing index drops finished jobs once
their retention passed, and the outbox group forgets consumer names of dispatchers long gone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from hitl_review.serve_app.work.inspector import Inspector
from hitl_review.statecore import keys
from hitl_review.statecore.store import Store, StoreConfig

from .conftest import _fresh_store
from .helpers import create


async def _indexed(store: Store) -> set[str]:
    out: set[str] = set()
    for p in range(keys.PARTITIONS):
        out |= set(await store.r.zrange(keys.jobs(p), 0, -1))
    return out


async def test_the_jobs_index_is_pruned_after_retention_without_any_listing(redis_server, store, image):
    short = Store.from_url(redis_server.url, StoreConfig(retention_s=1))
    try:
        finished = [await create(short, image) for _ in range(12)]
        for job_id in finished:
            await short.cancel(job_id, "ops")
        live = [await create(short, image) for _ in range(5)]
        assert await _indexed(short) == set(finished) | set(live)
        await asyncio.sleep(1.3)  # the records' TTL passes
        assert [j for j in finished if await short.r.exists(keys.job(j).meta)] == []
        inspector = Inspector(short, consumer="me")
        counts = await inspector.housekeeping()
        assert counts["index_pruned"] == len(finished)
        assert await _indexed(short) == set(live)
        for p in range(keys.PARTITIONS):
            assert await short.r.zcard(keys.expiring(p)) == 0
        assert (await inspector.housekeeping())["index_pruned"] == 0
    finally:
        await short.close()


async def test_a_finished_job_within_retention_stays_listed(store, image):
    job_id = await create(store, image)
    await store.cancel(job_id, "ops")
    assert await store.prune_expired() == 0
    assert job_id in await _indexed(store)


async def _consumers(store: Store) -> dict[str, int]:
    """consumer name -> pending entries, over every outbox stream."""
    out: dict[str, int] = {}
    for stream in keys.all_outboxes():
        for c in await store.r.xinfo_consumers(stream, keys.OUTBOX_GROUP):
            out[c["name"]] = out.get(c["name"], 0) + int(c["pending"])
    return out


async def _serve_one(store: Store, consumer: str, image) -> None:
    """A dispatcher ``consumer`` that took one command and acknowledged it (a consumer name exists
    in a stream once it has been handed an entry there)."""
    await create(store, image)
    for entry in await store.outbox_read(consumer, count=10, block_ms=0):
        await store.outbox_ack(entry)


@pytest_asyncio.fixture(params=["server", "cluster"])
async def any_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """A fresh store on one redis-server, then on the 3-node cluster (the prune's pipeline spans slots)."""
    cluster = request.param == "cluster"
    server = request.getfixturevalue("redis_cluster" if cluster else "redis_server")
    s = await _fresh_store(server.url, cluster=cluster)
    yield s
    await s.close()


async def test_idle_consumer_names_are_deleted_but_never_one_holding_work(any_store: Store, image):
    store = any_store
    for n in range(6):  # six dispatcher processes that came and went, holding nothing
        await _serve_one(store, f"gone-{n}", image)
    await create(store, image)  # a DETECT_SUBJECTS command...
    held = await store.outbox_read("crashed", count=10, block_ms=0)  # ...taken by one that then died
    assert len(held) == 1
    await _serve_one(store, "me", image)
    assert set(await _consumers(store)) == {"me", "crashed", *(f"gone-{n}" for n in range(6))}

    inspector = Inspector(store, consumer="me", consumer_idle_ms=0)
    assert (await inspector.housekeeping())["consumers_deleted"] > 0
    left = await _consumers(store)
    assert set(left) == {"me", "crashed"} and left["crashed"] == 1  # its pending entry is not dropped

    reclaimed = await store.outbox_reclaim("me", min_idle_ms=0)
    assert [e.command.node_instance_id for e in reclaimed] == [held[0].command.node_instance_id]
    await inspector.housekeeping()
    assert set(await _consumers(store)) == {"me"}


async def test_a_recently_active_consumer_is_kept(store, image):
    await _serve_one(store, "peer", image)
    assert await store.prune_consumers("me", idle_ms=60_000) == 0
    assert "peer" in await _consumers(store)
