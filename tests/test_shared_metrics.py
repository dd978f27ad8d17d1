"""Counters and histograms add up across processes in Redis (serve_app.observability.shared_metrics): two
processes' increments, flushed, read the same totals from either, so two scrapes through a load
balancer agree (the two-replica run under Ray Serve: tests/test_metrics_replicas.py)."""

from __future__ import annotations

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
