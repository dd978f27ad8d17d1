"""A /metrics scrape's work on Redis does not grow with the jobs waiting for review (issue 37; SPEC §9:
a scrape costs the same with 10 or 10 million jobs). Counted, not timed: the commands the route's
reads send, their round trips and the size of the replies, with 10 and with 1 000 jobs waiting on
the real redis-server. It used to read every waiting job's id (``ZRANGE waiting 0 -1`` per
partition, for the unwatched pauses), and the outbox's pending count took 64 round trips."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
import redis.exceptions

from harness.bulk import bulk_waiting
from hitl_review.serve_app.observability import metrics
from hitl_review.serve_app.ops.ports import free_port
from hitl_review.statecore import keys, watchers
from hitl_review.statecore.store import Store

from .helpers import waiting_job
from .redis_traffic import Traffic, traffic

WINDOW_S = 3600.0


async def route_reads(store) -> None:
    """What the /metrics route (serve_app/routes/api.py ``prometheus``) reads from Redis: its own call."""
    await metrics.refresh_from_store(store, WINDOW_S)


# The shared counters' flush (``metrics.SHARED.flush``) sends one HINCRBYFLOAT per sample this process moved
# since its last flush, in one round trip: any work of the process moves them (a run saw one more in the
# second scrape than in the first), none of it the jobs waiting. Compared apart, bounded by the samples.
FLUSH = "HINCRBYFLOAT"


def without_flush(seen: Traffic) -> tuple[Counter[str], int]:
    """The scrape's commands and round trips less the flush's."""
    commands = Counter(seen.commands)
    moved = commands.pop(FLUSH, 0)
    return commands, seen.round_trips - (1 if moved else 0)


async def scrape_traffic(store) -> Traffic:
    await route_reads(store)  # scripts loaded, connections open
    with traffic() as seen:
        await route_reads(store)
    return seen


async def brute_force(store, now_ms: int) -> tuple[int, float]:
    """The figures by reading every waiting job (what ``watchers.read`` did): the reference."""
    unwatched, oldest = 0, None
    for p in range(keys.PARTITIONS):
        watched = set(await store.r.zrangebyscore(keys.watched(p), now_ms, "+inf"))
        for job_id, since in await store.r.zrange(keys.waiting(p), 0, -1, withscores=True):
            if job_id not in watched:
                unwatched += 1
                oldest = since if oldest is None else min(oldest, since)
    return unwatched, max(0.0, (now_ms - oldest) / 1000) if oldest is not None else 0.0


async def test_a_scrape_sends_the_same_commands_with_10_and_1000_jobs_waiting(store):
    first = await bulk_waiting(store, 10)
    # Two waiting jobs followed (one of them the oldest of its partition) and one that is not waiting.
    await watchers.beacon(store.r, "events-1", [first[0], first[1], keys.new_job_id()], streams=3)
    small = await scrape_traffic(store)
    assert metrics.STUCK_STATE.watch is not None and metrics.STUCK_STATE.watch.waiting_unwatched == 8

    await bulk_waiting(store, 990)
    await watchers.beacon(store.r, "events-1", [first[0], first[1]], streams=3)
    large = await scrape_traffic(store)
    assert metrics.STUCK_STATE.watch.waiting_unwatched == 998

    assert without_flush(large) == without_flush(small), (small, large)
    shared_samples = len(metrics.SHARED._samples())  # the flush's ceiling: one per shared sample, whatever waits
    assert large.commands[FLUSH] <= shared_samples and small.commands[FLUSH] <= shared_samples
    # With 10 jobs most partitions are empty; with 1 000 each reply holds its partition's oldest pause
    # (id and score, ~40 chars, read twice) and counts with more digits: bounded per partition, never
    # a job id per waiting job (990 x ~45 chars more).
    grown = large.reply_chars - small.reply_chars
    assert grown < 120 * keys.PARTITIONS, (small.reply_chars, large.reply_chars)
    assert small.round_trips <= 12, small.round_trips  # the outbox's 64 sequential XINFO are one round
    # The settled coverage reads four sums a partition (the read script sums the buckets): it read each of
    # the window's ~220 bucket fields, most of them empty (~1,600 characters a partition in all, now ~550).
    assert large.reply_chars < 800 * keys.PARTITIONS, large.reply_chars


async def test_unwatched_pauses_agree_with_reading_every_waiting_job(store):
    jobs = await bulk_waiting(store, 40)
    now = int(time.time() * 1000) + 2_000
    # Watch the oldest jobs of several partitions, so the oldest unwatched pause lies behind them.
    oldest_each = {}
    for p in range(keys.PARTITIONS):
        head = await store.r.zrange(keys.waiting(p), 0, 1)
        if head:
            oldest_each[p] = head
    followed = [h[0] for h in oldest_each.values()] + [h[1] for h in oldest_each.values() if len(h) > 1][:3]
    await watchers.beacon(store.r, "events-1", [*followed, jobs[-1], keys.new_job_id()], streams=2, now_ms=now)
    got = await watchers.read(store.r, now_ms=now)
    assert (got.waiting_unwatched, got.oldest_unwatched_pause_age_s) == await brute_force(store, now)
    assert got.waiting_unwatched == 40 - len(set(followed) | {jobs[-1]}) and got.streams == 2
    # Past the watch TTL nobody follows anything: every waiting job is unwatched.
    later = now + int(watchers.WATCH_TTL_S * 1000) + 1
    gone = await watchers.read(store.r, now_ms=later)
    assert (gone.waiting_unwatched, gone.oldest_unwatched_pause_age_s) == await brute_force(store, later)
    assert gone.waiting_unwatched == 40


async def test_the_scrape_reads_work_on_a_cluster(cluster_store, image):
    store = cluster_store
    jobs = [await waiting_job(store, image) for _ in range(3)]
    await store.create_job("alice", image)  # its detection queued: one command not yet delivered
    await watchers.beacon(store.r, "events-1", jobs[:1], streams=1)
    got = await watchers.read(store.r)
    assert (got.waiting_unwatched, got.streams) == (2, 1) and got.oldest_unwatched_pause_age_s >= 0
    assert await store.outbox_pending() == 4  # the three reported commands were never acknowledged


async def test_the_counter_counts_only_what_its_block_sends(store):
    """Another loop of the process talking to Redis meanwhile (a dispatcher a test left running, an
    in-process server) is not counted: a full run once saw its XAUTOCLAIM and XREADGROUP in a scrape.
    The block's GET may need a new connection (the other loop holds the first): its handshake counts."""
    stop = asyncio.Event()
    pings = 0

    async def noise() -> None:
        nonlocal pings
        while not stop.is_set():
            await store.r.ping()
            pings += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(noise())
    await asyncio.sleep(0.01)
    with traffic() as seen:
        await store.r.get("hitl:test:nothing")
        during = pings
        await asyncio.sleep(0.05)
        during = pings - during
    stop.set()
    await task
    assert during > 5, during  # the other loop was busy meanwhile
    assert seen.commands["GET"] == 1 and set(seen.commands) <= {"GET", "HELLO", "CLIENT", "PING"}, seen
    assert seen.commands["PING"] <= 1, seen  # at most a new connection's own, never the loop's


async def test_a_scrape_whose_store_read_fails_shows_the_store_down_and_says_why(store):
    """The reads run side by side (``metrics.refresh_from_store``): one failing still marks the counters'
    series down and raises, as the reads one after the other did; the route logs it and answers."""
    await bulk_waiting(store, 3)
    await metrics.refresh_from_store(store, WINDOW_S)
    assert b"hitl_metrics_store_up 1.0" in metrics.render()
    gone = Store.from_url(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    try:
        with pytest.raises(redis.exceptions.ConnectionError):
            await metrics.refresh_from_store(gone, WINDOW_S)
    finally:
        await gone.close()
    assert b"hitl_metrics_store_up 0.0" in metrics.render()
    await metrics.refresh_from_store(store, WINDOW_S)  # back: up, the counts read again
    assert b"hitl_metrics_store_up 1.0" in metrics.render()
