"""The box auto-approve policy's figures on ``/metrics`` (docs/learning.md), read from Redis at each
scrape (statecore.auto_store): the same on every replica, so aggregate with ``max()``, never ``sum()``.

``hitl_auto_approve_dropped`` is 1 while the live check has dropped the policy to ``shadow`` (its
spot checks' false-accept rate is above the promise with the policy's confidence): the alert
``HitlAutoApproveDroppedToShadow`` in deploy/prometheus/rules.yml fires on it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hitl_review.statecore import auto_store
from hitl_review.statecore.autoapprove import MODES, lower_bound

DROPPED_DOC = "1 while the live spot checks have dropped the box policy to shadow (until an operator turns it on)"
CONFIDENCE = 0.95  # the live rate's lower bound shown here (the drop itself uses the policy's own)


class PolicyState(Collector):
    def __init__(self) -> None:
        self.live: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.gate: dict[str, int] = {}

    async def refresh(self, r: Any) -> None:
        self.live = await auto_store.live(r)
        ref = self.live.get("ref")
        self.counts = await auto_store.counts(r, ref) if ref else {}
        self.gate = await auto_store.gate_counts(r)

    def collect(self) -> Iterator[Metric]:
        """Every family on every scrape (without samples while no policy ever started), so the dashboard's
        queries always name series that exist."""
        ref = self.live.get("ref")
        mode = GaugeMetricFamily(
            "hitl_auto_approve_mode", "The box policy's live mode (1 for the one in force)", labels=["policy", "mode"]
        )
        d = GaugeMetricFamily("hitl_auto_approve_dropped", DROPPED_DOC, labels=["policy"])
        decisions = GaugeMetricFamily(
            "hitl_auto_approve_decisions",
            "The box policy's decisions and the reviews of them, by kind (statecore.auto_store.COUNTERS; from Redis)",
            labels=["policy", "kind"],
        )
        low = GaugeMetricFamily(
            "hitl_auto_approve_spot_false_accept_lower",
            "Lower 95 % Clopper-Pearson bound of the false-accept rate its spot checks measured",
            labels=["policy"],
        )
        gate = GaugeMetricFamily(
            "hitl_gate_spot_checks",
            "Masks the quality gate passed that a person checked unmarked (spot), and did not accept (spot_fa)",
            labels=["kind"],
        )
        for kind in auto_store.GATE_COUNTERS:
            gate.add_metric([kind.removeprefix("gate_")], float(self.gate.get(kind, 0)))
        if not ref:  # no policy ever started: the alert's series still exists, at 0
            d.add_metric([""], 0.0)
            yield from (mode, d, decisions, low, gate)
            return
        for m in MODES:
            mode.add_metric([ref, m], 1.0 if self.live.get("mode") == m else 0.0)
        dropped = self.live.get("mode") == "shadow" and bool(self.live.get("dropped_at"))
        d.add_metric([ref], 1.0 if dropped else 0.0)
        for kind in auto_store.COUNTERS:
            decisions.add_metric([ref, kind], float(self.counts.get(kind, 0)))
        n, k = self.counts.get("spot", 0), self.counts.get("spot_fa", 0)
        low.add_metric([ref], lower_bound(k, n, CONFIDENCE))
        yield from (mode, d, decisions, low, gate)


POLICY_STATE = PolicyState()
