"""What the automatic policies decided and how it is going, on the reviewer page's stats and the dashboard
(docs/learning.md): the figures come from the same Redis counters the live check reads, through the
``/metrics`` collector, on the test's redis-server."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from harness.executor import report
from hitl_review.serve_app.observability.policy_metrics import PolicyState
from hitl_review.statecore.store import Store, StoreConfig
from hitl_review.ui.stats import policy_figures, policy_markdown

from .auto_policy_util import SURE_BOXES, config
from .helpers import iv, keep
from .test_gate_spot_check import FAIL, PASS, _segmented, _store, decide

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "hitl.json"


async def _scrape(r) -> str:
    state = PolicyState()
    await state.refresh(r)
    registry = CollectorRegistry()
    registry.register(state)
    return generate_latest(registry).decode()


async def test_the_page_stats_show_what_the_policies_decided_and_how_it_is_going(store, image, redis_server):
    off = policy_markdown(policy_figures(await _scrape(store.r)))
    assert "Box auto-approval: **off**" in off and "spot-checked: **0**" in off
    # One job approved automatically, then a spot check the reviewer changes: the policy drops to shadow.
    on = Store(store.r, StoreConfig(retention_s=3600, auto_approve=config("on", spot_check=0.0)))
    job = (await on.create_job("alice", image)).job_id
    assert await report(on, job, {"boxes": SURE_BOXES}) == "OK"
    spot = Store(store.r, StoreConfig(retention_s=3600, auto_approve=config("on", spot_check=1.0)))
    job = (await spot.create_job("alice", image)).job_id
    assert await report(spot, job, {"boxes": SURE_BOXES}) == "OK"
    st = await spot.get(job)
    assert (await spot.intervene(job, iv(st, keep(st, 0)), "rev1")).status_code == 200
    # A mask the gate passed, checked by a person who rejects it.
    masks = await _store(redis_server.url, 1.0)
    job, (good, bad) = await _segmented(masks, image, [PASS, FAIL])
    st = await masks.get(job)
    ds = [{"box_id": good, "decision": "REJECT", "reason": "cut off"}, {"box_id": bad, "decision": "ACCEPT"}]
    assert (await masks.intervene(job, decide(st, ds), "rev1")).status_code == 200
    await masks.close()
    f = policy_figures(await _scrape(store.r))
    ref = on.config.auto_approve.policy.ref  # type: ignore[union-attr]
    assert (f.policy, f.mode, f.dropped) == (ref, "shadow", True)
    assert (f.decisions["auto"], f.decisions["spot"], f.decisions["spot_fa"]) == (1, 1, 1)
    assert abs(f.spot_lower - 0.05) < 1e-9 and f.gate == {"spot": 1, "spot_fa": 1}  # beta.ppf(0.05, 1, 1) = 0.05
    text = policy_markdown(f)
    assert f"Box policy `{ref}`: **shadow** — *dropped to shadow by its spot checks*" in text
    assert "Approved automatically: **1** jobs" in text
    assert "Spot checks: **1**, false accepts **1** (rate 100.0%, live lower bound 5.00%)" in text
    assert "Masks the gate passed, spot-checked: **1**, not accepted **1** (rate 100.0%)" in text


def _queried(prefixes: tuple[str, ...]) -> set[str]:
    import re

    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    return {n for e in exprs for n in re.findall(r"\bhitl_[a-z0-9_]+", e) if n.startswith(prefixes)}


async def test_the_dashboard_s_policy_panels_query_series_the_collector_exports(store, image):
    queried = _queried(("hitl_auto_approve_", "hitl_gate_"))
    assert {
        "hitl_auto_approve_mode",
        "hitl_auto_approve_dropped",
        "hitl_auto_approve_decisions",
        "hitl_auto_approve_spot_false_accept_lower",
        "hitl_gate_spot_checks",
    } <= queried
    # Before any policy started (what a fresh deployment scrapes) and after: every family is there.
    for stage in ("none", "started"):
        if stage == "started":
            on = Store(store.r, StoreConfig(retention_s=3600, auto_approve=config("on", spot_check=0.0)))
            job = (await on.create_job("alice", image)).job_id
            assert await report(on, job, {"boxes": SURE_BOXES}) == "OK"
        text = await _scrape(store.r)
        exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
        assert queried <= exported, (stage, queried - exported)
