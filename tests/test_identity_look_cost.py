"""What the store-reset watch reads every inspector pass (statecore.identity.seen, the last look a
reset report keeps) against a real redis-server: its cost is O(cap), not O(backlog). It read every
live id of every partition to keep 10,000: at 100,000 waiting, 151 ms of Redis CPU and 364 ms of
the dispatcher's time every 5 s, growing with the review queue (issue 37: the Redis CPU measured
around a scrape grew 22 -> 68 ms from 1,000 to 100,000 waiting)."""

from __future__ import annotations

from hitl_review.statecore import identity, keys
from hitl_review.statecore.store import Store


async def _waiting(store: Store, n: int) -> None:
    async with store.r.pipeline(transaction=False) as pipe:
        for i in range(n):
            pipe.zadd(keys.waiting(i % keys.PARTITIONS), {f"job_{i:08d}": i})
        await pipe.execute()


async def _bytes_out(store: Store) -> int:
    return int((await store.r.info("stats"))["total_net_output_bytes"])


async def test_the_last_look_reads_at_most_its_cap_whatever_the_backlog(store: Store) -> None:
    await _waiting(store, 20_000)
    before = await _bytes_out(store)
    live, truncated = await identity.live_jobs(store.r, cap=640)
    sent = await _bytes_out(store) - before
    assert truncated and len(live["waiting"]) == 640 and len(set(live["waiting"])) == 640
    # 640 ids of ~13 bytes and the counts; reading every id sends 20,000 of them (~340 kB).
    print(f"\n[identity] 20,000 waiting, cap 640: {sent:,} bytes sent by Redis")
    assert sent < 40_000, sent


async def test_with_fewer_live_jobs_than_the_cap_the_look_keeps_them_all(store: Store) -> None:
    await _waiting(store, 300)
    await store.r.zadd(keys.queued(3), {"job_q": 1})
    await store.r.zadd(keys.running(5), {keys.node_member("job_r", "box_1"): 1, keys.node_member("job_r", "box_2"): 2})
    live, truncated = await identity.live_jobs(store.r, cap=10_000)
    assert not truncated
    assert sorted(live["waiting"]) == [f"job_{i:08d}" for i in range(300)]
    assert live["queued"] == ["job_q"] and live["running"] == ["job_r"]
    seen = await identity.seen(store.r)
    assert len(seen["live_jobs"]["waiting"]) == 300 and not seen["live_jobs_truncated"]
