"""The shipped monitoring (deploy/): the Prometheus alert rules pass ``promtool check rules`` and
their unit tests (``promtool test rules``), and every hitl_* metric the rules and the Grafana
dashboard query exists in a real /metrics scrape of the control plane."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.ci import require_binary
from harness.tokens import TOKENS
from hitl_review.client import HitlClient, new_intervention_id
from hitl_review.serve_app.observability import metrics
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.statecore.counters import STATUSES, TOTALS, Coverage, Snapshot

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "rules_test.yml"
DASHBOARD = DEPLOY / "grafana" / "hitl.json"
NAME = re.compile(r"\bhitl_[a-z0-9_]+")


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]


def _redis_held() -> set[str]:
    """The hitl_* metrics every API replica reads from Redis (the same value on each)."""
    snap = Snapshot(
        by_status=dict.fromkeys(STATUSES, 0),
        totals=dict.fromkeys(TOTALS, 0),
        coverage=Coverage(3600, 0, 0, 0, 0),
        backlog=0,
        oldest_queued_age_s=0,
        oldest_pause_age_s=0,
        oldest_running_age_s=0,
        oldest_heartbeat_age_s=0,
    )
    state = metrics.RedisState()
    state.update(snap)
    stuck = metrics.StuckState()
    stuck.figures = metrics.StuckFigures(0, 0.0, 0, Coverage(3600, 0, 0, 0, 0))
    names = {"hitl_outbox_pending"}  # set from Redis at each scrape, too
    for fam in [*state.collect(), *stuck.collect()]:
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
    # Counters and histograms each process adds into Redis (serve_app/observability/shared_metrics.py).
    for fam in metrics.LOCAL.collect():
        names.update(fam.name + suffix for suffix in ("", "_total", "_bucket", "_count", "_sum"))
    return names - {"hitl_metrics_store_up"}  # each replica's own view of Redis


SUM = re.compile(r"\bsum\s*(?:by\s*\([^)]*\)\s*)?\(")


def _summed(expr: str) -> set[str]:
    """The metric names inside every sum(...) of a PromQL expression."""
    names: set[str] = set()
    for m in SUM.finditer(expr):
        depth, i = 1, m.end()
        while depth and i < len(expr):
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            i += 1
        names.update(NAME.findall(expr[m.end() : i]))
    return names


def _queried() -> set[str]:
    texts = _dashboard_exprs()
    for rule in _rules():
        texts.append(rule["expr"])
        texts.extend(rule.get("annotations", {}).values())  # {{ query "..." }} in annotations
    return {name for text in texts for name in NAME.findall(text)}


def _exported(text: str) -> set[str]:
    names: set[str] = set()
    for fam in text_string_to_metric_families(text):
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
        if fam.type == "counter":
            names.add(fam.name + "_total")
    return names


def test_promtool_checks_and_unit_tests_the_rules():
    promtool = require_binary("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", RULES_TEST.name],
        cwd=RULES_TEST.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_seed_002_thresholds_and_pause_alerts_only_page_people():
    rules = {r["alert"]: r for r in _rules()}
    assert rules["HitlTerminalCoverageLow"]["for"] == "10m" and "< 0.98" in rules["HitlTerminalCoverageLow"]["expr"]
    assert "> 7200" in rules["HitlNodeRunningTooLong"]["expr"]
    assert rules["HitlWriteBackFailuresHigh"]["for"] == "5m" and "> 0.01" in rules["HitlWriteBackFailuresHigh"]["expr"]
    # Age, not presence: the coverage alert reads the settled ratio (jobs submitted 15+ minutes ago).
    assert "hitl_terminal_coverage_settled_ratio" in rules["HitlTerminalCoverageLow"]["expr"]
    pause_rules = [
        r
        for r in rules.values()
        if "hitl_oldest_pause_age_seconds" in r["expr"] or "hitl_oldest_unwatched_pause_age_seconds" in r["expr"]
    ]
    assert "HitlReviewUnwatched" in {r["alert"] for r in pause_rules}  # seed 000: age and whether anyone watches
    assert len(pause_rules) >= 1
    assert all(r["labels"]["audience"] == "reviewers" for r in pause_rules)
    # Nothing but the pause rules goes to reviewers.
    assert {a for a, r in rules.items() if r["labels"]["audience"] == "reviewers"} == {r["alert"] for r in pause_rules}


def test_the_alerts_an_outage_needs():
    """The API down, Redis come back empty, and write-backs failing while Redis is still down (the
    Redis-held hitl_writeback_failures_total only moves once it is back)."""
    exprs = {r["alert"]: r["expr"] for r in _rules()}
    assert "absent(hitl_metrics_store_up)" in exprs["HitlApiDown"]
    assert "up{" in exprs["HitlApiReplicaDown"] and "== 0" in exprs["HitlApiReplicaDown"]
    assert "increase(hitl_store_resets_total" in exprs["HitlStoreReset"] and "> 0" in exprs["HitlStoreReset"]
    assert "hitl_writeback_spooled" in exprs["HitlWriteBackStalled"]
    assert "hitl_writeback_spooled" not in _redis_held()


def test_redis_held_values_are_never_summed_across_replicas():
    held = _redis_held()
    assert {"hitl_jobs", "hitl_outbox_pending", "hitl_running_nodes_stale_ratio", "hitl_interventions_total"} <= held
    exprs = _dashboard_exprs() + [r["expr"] for r in _rules()]
    doubled = sorted({f"{name} in {expr}" for expr in exprs for name in _summed(expr) & held})
    assert doubled == [], "summed over replicas that all read the same Redis value: use max()"


def test_the_dashboard_picks_one_deployment_by_job_and_namespace():
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"job", "namespace"} <= set(variables)
    for expr in _dashboard_exprs():
        for m in re.finditer(r"\bhitl_[a-z0-9_]+(\{[^}]*\})?", expr):
            assert m.group(1) and "$job" in m.group(1) and "$namespace" in m.group(1), expr


def test_the_dashboard_has_the_panels_asked_for():
    titles = " | ".join(p["title"].lower() for p in json.loads(DASHBOARD.read_text())["panels"])
    for word in (
        "request latency",
        "intervention outcomes",
        "running nodes: mean age",
        "write-back spool",
        "store resets",
        "coverage",
        "jobs by status",
        "backlog",
        "oldest queued",
        "pause age",
        "node attempts",
        "inspector",
        "write-back",
        "dead letters",
        "auto-approval: live mode",
        "spot checks: live false-accept rate",
        "mask spot checks",
    ):
        assert word in titles, word


def test_every_queried_metric_is_in_a_real_scrape(api_server):
    # One job through a review, so the per-process counters with labels (interventions) have samples.
    data, _ = product_composite(seed=4242, width=160, height=120, n=1)
    with HitlClient(api_server.url, TOKENS["admin"]) as client:
        job_id = client.submit(data, idempotency_key="monitoring:4242", filename="m.png").job_id
        waiting = client.wait_for(job_id, ["WAITING_USER_SELECTION"], timeout=30)
        if waiting.active_pause is not None:
            client.intervene(
                job_id,
                intervention_id=new_intervention_id(),
                pause_token=waiting.active_pause.pause_token,
                base_version=waiting.version,
                subjects=waiting.box_list,
            )
    with httpx.Client(base_url=api_server.url, timeout=10) as c:
        text = c.get("/metrics").text
    exported = _exported(text)
    queried = _queried()
    assert "hitl_terminal_coverage_ratio" in queried and "hitl_jobs" in queried
    missing = sorted(queried - exported)
    assert missing == [], f"queried by deploy/ but not exported by /metrics: {missing}"


OPERATIONS = DEPLOY.parent / "docs" / "operations.md"


def _anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub makes them."""
    out = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_every_alert_routes_on_severity_and_audience_and_links_its_runbook():
    """kube-prometheus-stack routes and inhibits on severity critical|warning|info; who is told is the
    audience label; each alert names its section of docs/operations.md, which says what to do."""
    anchors = _anchors(OPERATIONS.read_text())
    for rule in _rules():
        labels, name = rule["labels"], rule["alert"]
        assert labels["severity"] in ("critical", "warning", "info"), name
        pause = "pause_age_seconds" in rule["expr"]
        assert labels["audience"] == ("reviewers" if pause else "operators"), name
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/operations.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/operations.md has no section {name}"
    assert {"backups-and-restores", "redis", "postgresql"} <= anchors


def test_the_replica_down_alert_matches_the_api_scrape_not_ray_s():
    """The Prometheus Operator labels a PodMonitor's targets job="<namespace>/<name>": hitl-ray (Ray's
    metrics port) must not read as an API replica down, hitl-api (and a plain job named hitl-api) must."""
    [rule] = [r for r in _rules() if r["alert"] == "HitlApiReplicaDown"]
    m = re.fullmatch(r'up\{job=~"([^"]+)"\} == 0', rule["expr"])
    assert m, rule["expr"]
    matcher = re.compile(m[1])  # PromQL anchors a regex matcher at both ends: fullmatch
    monitors = [
        d["metadata"]["name"]
        for d in yaml.safe_load_all((DEPLOY / "kuberay" / "monitoring.yaml").read_text())
        if d["kind"] == "PodMonitor"
    ]
    assert sorted(monitors) == ["hitl-api", "hitl-ray"]
    assert matcher.fullmatch("hitl-api") and matcher.fullmatch("hitl/hitl-api")
    assert not matcher.fullmatch("hitl/hitl-ray") and not matcher.fullmatch("hitl-ray")


def test_the_embedding_cache_totals_are_counters():
    """Running totals the model replicas report: a counter (rate() and increase() apply), not a gauge."""
    metrics.EMBEDDING_CACHE.labels("Segmenter", "misses").set(3)
    [fam] = [f for f in text_string_to_metric_families(metrics.render().decode()) if f.name == "hitl_embedding_cache"]
    assert fam.type == "counter"
    [sample] = [s for s in fam.samples if s.labels == {"deployment": "Segmenter", "kind": "misses"}]
    assert sample.name == "hitl_embedding_cache_total" and sample.value == 3
