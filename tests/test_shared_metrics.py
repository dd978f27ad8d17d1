"""Counters and histograms add up across processes in Redis (serve_app.observability.shared_metrics): two
processes' increments, flushed, read the same totals from either, so two scrapes through a load
balancer agree (the two-replica run under Ray Serve: tests/test_metrics_replicas.py)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hitl_review.serve_app.observability.shared_metrics import KEY, Shared


def process() -> tuple[Shared, Counter, Histogram, CollectorRegistry]:
    """One process's metrics as serve_app.observability.metrics defines them: a local registry, the shared
    collector rendered in another."""
    local = CollectorRegistry()
    c = Counter("t_interventions_total", "doc", ["outcome"], registry=local)
    h = Histogram("t_latency_seconds", "doc", registry=local, buckets=(0.1, 1.0))
    shared = Shared(local)
    rendered = CollectorRegistry()
    rendered.register(shared)
    return shared, c, h, rendered


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


async def test_two_processes_increments_read_the_same_totals_from_either(store):
    r = store.r
    await r.delete(KEY)
    (a, ca, ha, ra), (b, cb, hb, rb) = process(), process()
    ca.labels("OK").inc(3)
    cb.labels("OK").inc(2)
    cb.labels("PAUSE_TOKEN_MISMATCH").inc()
    ha.observe(0.05)
    hb.observe(0.5)
    hb.observe(5)
    assert await a.flush(r) > 0 and await b.flush(r) > 0
    assert await a.flush(r) == 0  # nothing moved since: nothing written
    for s in (a, b):
        await s.refresh(r)
    got_a, got_b = samples(ra), samples(rb)
    assert got_a == got_b
    assert got_a[("t_interventions_total", (("outcome", "OK"),))] == 5
    assert got_a[("t_interventions_total", (("outcome", "PAUSE_TOKEN_MISMATCH"),))] == 1
    assert got_a[("t_latency_seconds_count", ())] == 3
    assert got_a[("t_latency_seconds_bucket", (("le", "0.1"),))] == 1
    assert got_a[("t_latency_seconds_bucket", (("le", "1.0"),))] == 2
    assert got_a[("t_latency_seconds_bucket", (("le", "+Inf"),))] == 3
    # Later increments add only what moved since the last flush.
    ca.labels("OK").inc()
    await a.flush(r)
    await b.refresh(r)
    assert samples(rb)[("t_interventions_total", (("outcome", "OK"),))] == 6


def test_two_event_loops_of_one_process_flush_without_waiting_on_each_other(redis_server):
    """The tests' in-process uvicorn server runs its own event loop in a thread beside the test's, and
    both flush the one ``metrics.SHARED``. Before: an asyncio.Lock held by one loop's flush (here slowed
    by CLIENT PAUSE) and waited on from the other was released from the first loop's thread, which never
    woke the waiting loop: a loop with no timer of its own slept for good (a 600 s hang in CI, a test of
    0.8 s taking 204 s in a full run)."""
    import asyncio
    import threading

    import redis
    import redis.asyncio as aioredis

    shared, c, _, _ = process()
    done: dict[str, BaseException | int] = {}

    def flush_in_own_loop(name: str) -> None:
        async def go() -> int:
            r = aioredis.Redis.from_url(redis_server.url)
            try:
                return await shared.flush(r)
            finally:
                await r.aclose()

        try:
            done[name] = asyncio.run(go())
        except BaseException as e:  # reported below, not lost in the thread
            done[name] = e

    admin = redis.Redis.from_url(redis_server.url)
    admin.delete(KEY)
    c.labels("OK").inc()
    admin.execute_command("CLIENT", "PAUSE", 600, "WRITE")  # the first flush holds on in HINCRBYFLOAT
    first = threading.Thread(target=flush_in_own_loop, args=("first",), daemon=True)
    first.start()
    import time

    time.sleep(0.2)
    second = threading.Thread(target=flush_in_own_loop, args=("second",), daemon=True)
    second.start()
    first.join(10)
    second.join(10)
    assert not second.is_alive(), "the second loop's flush never woke after the first released"
    assert done == {"first": 1, "second": 0}, done
    assert float(admin.hget(KEY, next(iter(shared.flushed)))) == 1.0


async def test_the_flusher_stops_when_a_cancel_is_swallowed_on_the_way(store, monkeypatch):
    """redis-py can swallow a task's cancel without raising (seen: a replica's shutdown in
    test_reviewer_accounts waited 300 s on this task, asleep for its next flush). The flusher checks
    once a round whether it is being cancelled, so the shutdown's gather returns."""
    shared, counter, _h, _r = process()
    flushing = asyncio.Event()
    real_flush = shared.flush

    async def swallowing_flush(r):
        flushing.set()
        try:
            await asyncio.sleep(0.2)  # the cancel lands here, as in a pipeline's read
        except asyncio.CancelledError:
            pass  # what the library did: no error, the call returns
        return await real_flush(r)

    monkeypatch.setattr(shared, "flush", swallowing_flush)
    counter.labels("OK").inc()
    task = asyncio.create_task(shared.flush_forever(store.r, every_s=0.01))
    await asyncio.wait_for(flushing.wait(), 5)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done, "the flusher kept going after its cancel was swallowed"
    assert task.cancelled()
