"""Per-process series behind a load-balanced ``/metrics`` (issue 38 item 5), and who may read
``/metrics`` and the API's docs.

Two Api replicas behind Serve's proxy answer scrapes in turn: a figure of one process alone (its
write-back spool, its dispatcher's calls) served by both in one series alternates between their
values, so ``HitlWriteBackStalled`` may never hold for its ``for:``. With several Api replicas those
series leave ``/metrics`` and go per replica through Ray's metrics port (``RayExport``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.tokens import TOKENS_SPEC, auth
from hitl_review.serve_app.observability import metrics
from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.routes.api import Runtime, create_app
from hitl_review.serve_app.routes.auth import Authenticator
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.store import Store, StoreConfig

from .asgi_util import BASE_URL, _no_events, _ready

PER_PROCESS = ("hitl_writeback_spooled", "hitl_dispatcher_calls", "hitl_dispatcher_call_limit", "hitl_store_resets")
MONITOR = {"Authorization": "Bearer tok-prom"}


def _series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        if fam.name in PER_PROCESS
        for s in fam.samples
        if not s.name.endswith("_created")
    }


@asynccontextmanager
async def _replica(url: str, data_dir: Path, **more: Any) -> AsyncIterator[httpx.AsyncClient]:
    """One Api replica in this process (its own app and store) on the test's Redis."""
    settings = Settings(data_dir=data_dir, redis_url=url, **{"tokens": TOKENS_SPEC, **more})

    async def build() -> Runtime:
        return Runtime(
            settings=settings,
            store=Store.from_url(url, StoreConfig(retention_s=3600, node_timeout_s=60)),
            artifacts=ArtifactStore(settings.artifacts),
            auth=Authenticator.from_settings(settings.tokens, settings.data_dir, settings.loopback),
            events=_no_events,
            readiness=_ready,
        )

    app = create_app(build)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL, timeout=30) as c:
            yield c


async def _scrape_as(c: httpx.AsyncClient, spooled: int, calls: int) -> dict[Any, float]:
    """A scrape of ``c`` while its process holds ``spooled`` results and ``calls`` Detector calls (the
    two replicas share this test's process, so each one's own figures are set before its scrape)."""
    metrics.WRITEBACK_SPOOLED.set(spooled)
    metrics.DISPATCH_CALLS.labels("Detector").set(calls)
    r = await c.get("/metrics", headers=auth("admin"))
    assert r.status_code == 200, r.text
    return _series(r.text)


async def test_two_api_replicas_never_serve_one_per_process_series_with_their_two_values(store, redis_server, tmp_path):
    try:
        async with (
            _replica(redis_server.url, tmp_path / "a", api_replicas=2) as a,
            _replica(redis_server.url, tmp_path / "b", api_replicas=2) as b,
        ):
            first, second = await _scrape_as(a, spooled=3, calls=5), await _scrape_as(b, spooled=0, calls=1)
        alternating = {k: (first[k], second[k]) for k in first.keys() & second.keys() if first[k] != second[k]}
        assert alternating == {}, f"one series, two replicas' values: {alternating}"
        assert first == second == {}, "per-process series left in a load-balanced /metrics"
        # One replica (plain uvicorn, or one Api replica): it answers every scrape, so they stay.
        async with _replica(redis_server.url, tmp_path / "c") as c:
            one = await _scrape_as(c, spooled=3, calls=5)
        assert one[("hitl_writeback_spooled", ())] == 3
        assert one[("hitl_dispatcher_calls", (("deployment", "Detector"),))] == 5
        assert ("hitl_store_resets_total", ()) in one
    finally:
        metrics.WRITEBACK_SPOOLED.set(0)
        metrics.DISPATCH_CALLS.labels("Detector").set(0)


class _RayGauge:
    """Records what ``ray.serve.metrics.Gauge`` would be given (Serve adds the replica's tags)."""

    made: dict[str, _RayGauge] = {}

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None) -> None:
        self.name, self.tag_keys, self.values = name, tag_keys, {}
        _RayGauge.made[name] = self

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        assert set(tags or {}) == set(self.tag_keys or ()), (self.name, tags)
        self.values[tuple(sorted((tags or {}).items()))] = value


def test_each_replica_exports_its_own_figures_through_ray():
    from hitl_review.serve_app.observability.process_metrics import RayExport

    resets_before = metrics.STORE_RESETS._value.get()
    try:
        metrics.WRITEBACK_SPOOLED.set(2)
        metrics.DISPATCH_LIMIT.labels("Segmenter").set(9)
        export = RayExport(gauge=_RayGauge)
        export.copy()
        metrics.WRITEBACK_SPOOLED.set(0)
        export.copy()  # the same gauges again, set to the new value
        made = _RayGauge.made
        assert set(made) == set(PER_PROCESS)
        assert made["hitl_writeback_spooled"].values == {(): 0}
        assert made["hitl_dispatcher_call_limit"].values[(("deployment", "Segmenter"),)] == 9
        assert made["hitl_store_resets"].values == {(): resets_before}  # a running total, from 0 at the start
    finally:
        metrics.WRITEBACK_SPOOLED.set(0)


@pytest.mark.parametrize(
    ("settings", "metrics_open", "docs_open"),
    [
        ({}, True, True),  # loopback (the default host): open, like the api-token file beside it
        ({"host": "0.0.0.0"}, False, False),  # beyond loopback: a token
        ({"host": "0.0.0.0", "public_metrics": True, "public_docs": True}, True, True),
        ({"public_metrics": False, "public_docs": False}, False, False),
    ],
)
async def test_metrics_and_docs_need_a_token_unless_public(
    store, redis_server, tmp_path, settings, metrics_open, docs_open
):
    tokens = TOKENS_SPEC + ",prom:monitor:tok-prom"
    async with _replica(redis_server.url, tmp_path, tokens=tokens, **settings) as c:
        for path, open_ in (("/metrics", metrics_open), ("/docs", docs_open), ("/openapi.json", docs_open)):
            r = await c.get(path)
            assert r.status_code == (200 if open_ else 401), (path, r.status_code)
        assert (await c.get("/metrics", headers=MONITOR)).status_code == 200
        assert (await c.get("/metrics", headers=auth("rev1"))).status_code == 200  # the reviewer page's stats
        if not metrics_open:
            assert (await c.get("/metrics", headers=auth("sub1"))).status_code == 403
        assert (await c.get("/openapi.json", headers=auth("sub1"))).status_code == 200
        assert (await c.get("/healthz")).status_code == 200
        monitor_elsewhere = await c.get("/api/v1/jobs", headers=MONITOR)
        assert monitor_elsewhere.status_code == 403, monitor_elsewhere.text  # the monitor role reads /metrics only
