"""The counters behind /metrics (statecore.counters, kept by ``apply_plan``), on a real redis-server:
statuses that drop to zero read 0, coverage on a constructed history, node retries, pruning that
uncounts exactly once, bounded coverage buckets, and the Prometheus rendering of a snapshot."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness.executor import report
from hitl_review.serve_app.observability import metrics
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.serve_app.work.writeback import WriteBack
from hitl_review.statecore import counters, keys
from hitl_review.statecore.states import TERMINAL, WAITING
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import create, detection_done, waiting_job

LIB = Path(__file__).resolve().parents[1] / "statecore" / "lua" / "_lib.lua"


async def _start(store: Store, job_id: str) -> str:
    """Play the dispatcher: start the job's queued node; its instance id."""
    nid = (await store.get(job_id)).current_node.node_instance_id
    (cmd,) = [c for c in await store.outbox_commands(job_id) if c.node_instance_id == nid]
    assert await store.node_started(cmd) == "OK"
    return nid


def test_the_lua_status_sets_are_the_state_tables():
    src = LIB.read_text()

    def lua_set(name: str) -> set[str]:
        body = re.search(rf"local {name} = \{{(.*?)\}}", src, re.S)
        assert body is not None, name
        return set(re.findall(r"([A-Z_]+) = true", body.group(1)))

    assert lua_set("TERMINAL") == {s.value for s in TERMINAL}
    assert lua_set("WAITING") == {s.value for s in WAITING}


async def test_a_status_that_drops_to_zero_reads_zero(store, image):
    job_id = await create(store, image)
    counts = await store.count_by_status()
    assert set(counts) == set(counters.STATUSES) and counts["DETECTING"] == 1
    await store.cancel(job_id, "alice")
    counts = await store.count_by_status()
    assert counts["DETECTING"] == 0 and counts["CANCELLED"] == 1
    assert sum(counts.values()) == 1
    snap = await counters.read(store.r)
    assert snap.by_status == counts
    # Rendered: every status has its sample, the emptied one included.
    metrics.REDIS_STATE.update(snap)
    samples = {
        s.labels["status"]: s.value
        for fam in text_string_to_metric_families(metrics.render().decode())
        if fam.name == "hitl_jobs"
        for s in fam.samples
    }
    assert set(samples) == set(counters.STATUSES)
    assert samples["DETECTING"] == 0 and samples["CANCELLED"] == 1


async def test_coverage_ratio_on_a_constructed_history(store, image):
    assert (await counters.read(store.r)).coverage.ratio == 1.0  # nothing submitted: 0 / 0 reads 1
    waiting = [await waiting_job(store, image) for _ in range(2)]
    cancelled = await waiting_job(store, image)
    await store.cancel(cancelled, "alice")  # by a user, from a pause
    failed = [await create(store, image) for _ in range(3)]
    for job_id in failed:
        await _start(store, job_id)
        assert await report(store, job_id, {}, outcome="FAILED", error_code="MODEL_ERROR") == "OK"
    running = [await create(store, image) for _ in range(4)]
    await _start(store, running[0])
    snap = await counters.read(store.r)
    c = snap.coverage
    assert (c.submitted, c.terminal, c.waiting, c.user_cancelled) == (10, 3, 2, 1)
    assert c.ratio == 3 / (10 - 2 - 1)
    assert snap.waiting == 2 and snap.by_status["FAILED"] == 3 and snap.by_status["DETECTING"] == 4
    assert snap.totals["submitted"] == 10 and snap.totals["finished"] == 4 and snap.totals["user_cancelled"] == 1
    assert snap.totals["node_starts"] == 4 and snap.totals["node_results"] == 3 + 3  # 3 detects to pauses
    assert snap.backlog == 3 and snap.oldest_queued_age_s >= 0 and snap.oldest_pause_age_s > 0
    assert 0 <= snap.oldest_running_age_s < 60 and snap.oldest_heartbeat_age_s < 60
    assert (snap.by_status, snap.coverage) == await counters.recount(store.r)
    # Two hours on, those jobs are outside a one-hour window: nothing submitted, ratio 1.
    later = await counters.read(store.r, 3600, now_ms=int(time.time() * 1000) + 2 * 3600_000)
    assert later.coverage.submitted == 0 and later.coverage.ratio == 1.0
    # The two waiting jobs get reviewed away (emptied selections end the job): full coverage.
    for job_id in waiting:
        await store.cancel(job_id, "bob")
    c = (await counters.read(store.r)).coverage
    assert (c.waiting, c.user_cancelled) == (0, 3) and c.ratio == 3 / (10 - 3)


async def test_node_retries_count_attempts_after_the_first(redis_server, store, image):
    fast = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=60, retry_backoff_s=0))
    try:
        job_id = await create(fast, image)
        nid = await _start(fast, job_id)
        lease = await fast.acquire_lease(keys.partition_of(job_id), "me", 15_000)
        assert lease is not None
        assert await fast.node_lost(job_id, nid, lease=lease) == "OK"
        await _start(fast, job_id)
        totals = (await counters.read(fast.r)).totals
        assert (totals["node_starts"], totals["node_retries"]) == (2, 1)
        await counters.incr(fast.r, job_id, "writeback_failures")
        await counters.incr(fast.r, job_id, "dead_letters", 2)
        totals = (await counters.read(fast.r)).totals
        assert (totals["writeback_failures"], totals["dead_letters"]) == (1, 2)
    finally:
        await fast.close()


async def test_pruning_uncounts_each_finished_job_once(redis_server, store, image):
    short = Store.from_url(redis_server.url, StoreConfig(retention_s=1))
    try:
        finished = [await create(short, image) for _ in range(6)]
        for job_id in finished:
            await short.cancel(job_id, "ops")
        await create(short, image)
        assert (await short.count_by_status())["CANCELLED"] == 6
        await asyncio.sleep(1.3)
        # Two replicas prune at once: each job is dropped, and uncounted, exactly once.
        dropped = await asyncio.gather(short.prune_expired(), short.prune_expired())
        assert sum(dropped) == 6
        counts = await short.count_by_status()
        assert counts["CANCELLED"] == 0 and counts["DETECTING"] == 1
        assert [p for p in range(keys.PARTITIONS) if await short.r.hlen(keys.finished(p))] == []
        assert counts == (await counters.recount(short.r))[0]
        # The coverage window still counts them as submitted (and cancelled) in their minute: a
        # retention shorter than the window is this test's artifice, not a deployment's.
        c = (await counters.read(short.r)).coverage
        assert (c.submitted, c.user_cancelled, c.ratio) == (7, 6, 0.0)
    finally:
        await short.close()


async def test_coverage_buckets_stay_bounded(store, image):
    """Entering a new minute deletes the buckets older than the horizon (6 h)."""
    cur = int(time.time() * 1000) // counters.MINUTE_MS
    old, kept = cur - 400, cur - 100
    for p in range(keys.PARTITIONS):
        await store.r.hset(
            keys.counts(p), mapping={"bucket:last": kept, f"sub:{old}": 5, f"term:{old}": 5, f"sub:{kept}": 1}
        )
    job_id = await create(store, image)
    fields = await store.r.hgetall(keys.counts(keys.partition_of(job_id)))
    assert f"sub:{old}" not in fields and f"term:{old}" not in fields
    assert fields[f"sub:{kept}"] == "1" and fields[f"sub:{cur}"] == "1" and fields["bucket:last"] == str(cur)
    # An untouched partition keeps its buckets until a job is created there.
    other = next(p for p in range(keys.PARTITIONS) if p != keys.partition_of(job_id))
    assert await store.r.hget(keys.counts(other), f"sub:{old}") == "5"


async def test_counters_read_on_a_redis_cluster(cluster_store, image):
    """Every script stays in one slot; the scrape's pipeline spans the cluster's nodes."""
    job_id = await create(cluster_store, image)
    await _start(cluster_store, job_id)
    await create(cluster_store, image)
    snap = await counters.read(cluster_store.r)
    assert snap.by_status["DETECTING"] == 2 and snap.coverage.submitted == 2 and snap.backlog == 1
    assert snap.totals["node_starts"] == 1 and snap.oldest_running_age_s < 60
    assert await cluster_store.count_by_status() == snap.by_status


# ---------------------------------------------------------------------------- stuck jobs, settled coverage


def _gauges(*names: str) -> dict[str, float]:
    text = metrics.render().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name in names}


async def test_stuck_figures_mean_running_age_and_stale_share(store, image):
    """Seed 002's figures: the mean age of RUNNING nodes and the share of them not heard from for over
    an hour; a queued node is not running, and a node whose heartbeat lapsed an hour ago is stale."""
    now_ms = int(time.time() * 1000)
    empty = await metrics.read_stuck(store.r, now_ms=now_ms)
    assert (empty.running, empty.mean_running_age_s, empty.stale_ratio) == (0, 0.0, 0.0)
    running = [await create(store, image) for _ in range(2)]
    for job_id in running:
        await _start(store, job_id)
    await create(store, image)  # queued: not running
    fresh = await metrics.read_stuck(store.r, now_ms=now_ms + 20 * 60_000)
    assert fresh.running == 2 and fresh.stale_running == 0
    assert 20 * 60 - 5 < fresh.mean_running_age_s < 20 * 60 + 5  # started ~20 minutes before that "now"
    # One node's last heartbeat 2 h before now: stale; the other beat a minute ago.
    later_ms = now_ms + 3 * 3600_000
    await store.r.zadd(keys.heartbeats(keys.partition_of(running[0])), {running[0]: later_ms - 2 * 3600_000})
    await store.r.zadd(keys.heartbeats(keys.partition_of(running[1])), {running[1]: later_ms - 60_000})
    stuck = await metrics.read_stuck(store.r, now_ms=later_ms)
    assert (stuck.running, stuck.stale_running, stuck.stale_ratio) == (2, 1, 0.5)
    assert 3 * 3600 - 5 < stuck.mean_running_age_s < 3 * 3600 + 5
    # Rendered, as /metrics shows them once refreshed.
    await metrics.refresh_stuck(store.r, 3600)
    shown = _gauges("hitl_running_nodes", "hitl_running_node_mean_age_seconds", "hitl_running_nodes_stale_ratio")
    assert shown["hitl_running_nodes"] == 2 and shown["hitl_running_nodes_stale_ratio"] == 0.0
    assert 0 <= shown["hitl_running_node_mean_age_seconds"] < 60


async def test_settled_coverage_leaves_out_work_in_flight_but_not_stuck_jobs(store, image):
    """A burst just submitted, its nodes queued and running, lowers the raw coverage at once; the
    settled coverage (jobs submitted at least 15 minutes ago) stays 1 until those jobs are old and
    still not terminal: age, not presence, makes a job count as stuck."""
    now_ms = int(time.time() * 1000)
    burst = [await create(store, image) for _ in range(5)]
    await _start(store, burst[0])
    done = await create(store, image)
    await _start(store, done)
    assert await report(store, done, {}, outcome="FAILED", error_code="MODEL_ERROR") == "OK"
    raw = (await counters.read(store.r, 3600, now_ms=now_ms)).coverage
    assert (raw.submitted, raw.terminal) == (6, 1) and raw.ratio < 0.98  # what paged during a healthy burst
    settled = (await metrics.read_stuck(store.r, 3600, now_ms=now_ms)).settled
    assert (settled.submitted, settled.ratio) == (0, 1.0)
    # 20 minutes on, the same jobs still not terminal are stuck: the settled ratio sees them.
    later = (await metrics.read_stuck(store.r, 3600, now_ms=now_ms + 20 * 60_000)).settled
    assert (later.submitted, later.terminal) == (6, 1) and later.ratio == 1 / 6
    # A short window settles after half of it (here 2 of 5 minutes), never after all of it.
    short = (await metrics.read_stuck(store.r, 300, now_ms=now_ms + 3 * 60_000)).settled
    assert short.window_s == 180 and short.submitted == 6


async def test_a_write_back_waiting_for_a_down_redis_shows_on_this_process_gauge(tmp_path, image):
    """While Redis is down the Redis-held hitl_writeback_failures_total cannot move (and /metrics
    cannot read it); this process's hitl_writeback_spooled says a result is waiting, at once."""
    server = RedisServer(tmp_path / "redis").start()
    store = Store.from_url(server.url, StoreConfig(retention_s=3600, node_timeout_s=60), timeout_s=1)
    try:
        await store.ensure_groups()
        job_id = await create(store, image)
        nr = await detection_done(store, job_id)
        wb = WriteBack(store, tmp_path / "data", first_gap_s=0.2)
        base = _gauges("hitl_writeback_spooled")["hitl_writeback_spooled"]
        await asyncio.to_thread(server.stop)
        applying = asyncio.create_task(wb.apply(nr))
        deadline = time.monotonic() + 20
        while _gauges("hitl_writeback_spooled")["hitl_writeback_spooled"] != base + 1:
            assert not applying.done(), applying.result()
            assert time.monotonic() < deadline, "the spooled result never showed on the gauge"
            await asyncio.sleep(0.05)
        assert wb.spooled() == [nr.node_instance_id]
        await asyncio.to_thread(server.start)
        assert await asyncio.wait_for(applying, 30) == "OK"
        assert _gauges("hitl_writeback_spooled")["hitl_writeback_spooled"] == base
        assert (await counters.read(store.r)).totals["writeback_failures"] == 1  # counted once Redis is back
    finally:
        await store.close()
        server.stop()
