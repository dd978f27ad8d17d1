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

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "rules_test.yml"
DASHBOARD = DEPLOY / "grafana" / "hitl.json"
NAME = re.compile(r"\bhitl_[a-z0-9_]+")


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]


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
    pause_rules = [r for r in rules.values() if "hitl_oldest_pause_age_seconds" in r["expr"]]
    assert len(pause_rules) >= 1
    assert all(r["labels"]["severity"] == "page-reviewers" for r in pause_rules)
    # Nothing but the pause-age rules pages reviewers.
    assert {a for a, r in rules.items() if r["labels"]["severity"] == "page-reviewers"} == {
        r["alert"] for r in pause_rules
    }


def test_the_dashboard_has_the_panels_asked_for():
    titles = " | ".join(p["title"].lower() for p in json.loads(DASHBOARD.read_text())["panels"])
    for word in (
        "coverage",
        "jobs by status",
        "backlog",
        "oldest queued",
        "pause age",
        "node attempts",
        "inspector",
        "write-back",
        "dead letters",
    ):
        assert word in titles, word


def test_every_queried_metric_is_in_a_real_scrape(api_server):
    with httpx.Client(base_url=api_server.url, timeout=10) as c:
        text = c.get("/metrics").text
    exported = _exported(text)
    queried = _queried()
    assert "hitl_terminal_coverage_ratio" in queried and "hitl_jobs" in queried
    missing = sorted(queried - exported)
    assert missing == [], f"queried by deploy/ but not exported by /metrics: {missing}"
