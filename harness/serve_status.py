"""What Serve itself says about the model deployments while a benchmark runs, and what the replicas
count of their own work.

- ``DeploymentWatcher`` polls Serve's status API (the dashboard's ``/api/serve/applications/``, what
  ``serve status`` reads) in a thread, for several deployments at once, and keeps per deployment the
  most replicas seen RUNNING, the autoscaler's targets and the deployment's config as Serve runs it
  (``max_ongoing_requests``, ``autoscaling_config``). ``harness.autoscale.ReplicaWatcher`` draws
  one deployment over time; this one answers "how many replicas and slots did it have".
- ``model_node_counts`` reads Ray's Prometheus endpoint (``hitl up`` names it in its log): the
  replicas' own ``ray_hitl_model_node_seconds`` histogram (``deployments.metrics``), count and sum
  per deployment, node type and outcome, summed over replicas, and the replicas seen per deployment.
  A replica that died takes its series with it: the figures are what the live replicas counted.
  Outcomes: ``ok`` and ``error`` are executions (the replica ran the node); ``not_started`` is a call
  whose node the replica did not start (already running elsewhere, or superseded): it computed
  nothing, so ``executed`` leaves it out of every count of executions.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from typing import Any

import httpx

METRICS_LINE = re.compile(r"Ray's metrics for Prometheus.*(http://\S+/metrics)")
SERIES = re.compile(r"^ray_hitl_model_node_seconds_(count|sum)\{(.*)\}\s+(\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# The outcomes of a call that ran its node; the third, "not_started", computed nothing.
EXECUTED_OUTCOMES = ("ok", "error")


class DeploymentWatcher:
    def __init__(
        self,
        dashboard_url: str,
        app: str,
        deployments: tuple[str, ...],
        headers: dict[str, str],
        period_s: float = 1.0,
    ) -> None:
        self.url = f"{dashboard_url}/api/serve/applications/"
        self.app, self.deployments, self.headers, self.period_s = app, deployments, headers, period_s
        self.max_running: dict[str, int] = dict.fromkeys(deployments, 0)
        self.max_target: dict[str, int] = dict.fromkeys(deployments, 0)
        self.config: dict[str, dict[str, Any]] = {}
        self.samples = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deployment-watcher", daemon=True)

    def start(self) -> DeploymentWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def reset_peaks(self) -> None:
        """Start counting the most replicas RUNNING afresh (a new phase of the benchmark)."""
        for name in self.deployments:
            self.max_running[name] = 0
            self.max_target[name] = 0

    def _run(self) -> None:
        with httpx.Client(headers=self.headers, timeout=10) as c:
            while not self._stop.is_set():
                try:
                    self.observe(c.get(self.url).json())
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    self.errors += 1  # a slow or restarting dashboard: skip this poll
                self._stop.wait(self.period_s)

    def observe(self, details: dict[str, Any]) -> None:
        deps = details["applications"][self.app]["deployments"]
        for name in self.deployments:
            d = deps.get(name)
            if not d:
                continue
            running = sum(1 for r in d.get("replicas") or [] if r.get("state") == "RUNNING")
            self.max_running[name] = max(self.max_running[name], running)
            self.max_target[name] = max(self.max_target[name], int(d.get("target_num_replicas") or 0))
            cfg = d.get("deployment_config") or {}
            self.config[name] = {
                "max_ongoing_requests": cfg.get("max_ongoing_requests"),
                "num_replicas": cfg.get("num_replicas"),
                "autoscaling_config": cfg.get("autoscaling_config"),
            }
        self.samples += 1

    def max_replicas_configured(self, name: str) -> int | None:
        cfg = self.config.get(name) or {}
        auto = cfg.get("autoscaling_config") or {}
        value = auto.get("max_replicas") or cfg.get("num_replicas")
        return int(value) if value else None

    def slots(self, name: str) -> int | None:
        value = (self.config.get(name) or {}).get("max_ongoing_requests")
        return int(value) if value else None


def metrics_url(lines: list[str]) -> str | None:
    """Ray's Prometheus endpoint as ``hitl up`` logged it, if it did."""
    for line in lines:
        m = METRICS_LINE.search(line)
        if m:
            return m.group(1)
    return None


def parse_node_counts(text: str) -> dict[str, Any]:
    """``{"count": {(deployment, node_type, outcome): n}, "sum": {…: seconds}, "replicas": {deployment: n}}``
    from a Prometheus text page, summed over replicas; every outcome, ``not_started`` included (``executed``
    keeps the executions)."""
    count: dict[tuple[str, str, str], float] = defaultdict(float)
    total: dict[tuple[str, str, str], float] = defaultdict(float)
    replicas: dict[str, set[str]] = defaultdict(set)
    for line in text.splitlines():
        m = SERIES.match(line)
        if not m:
            continue
        labels = dict(LABEL.findall(m.group(2)))
        key = (labels.get("deployment", "?"), labels.get("node_type", "?"), labels.get("outcome", "?"))
        value = float(m.group(3))
        (count if m.group(1) == "count" else total)[key] += value
        replicas[key[0]].add(labels.get("replica", "?"))
    return {"count": dict(count), "sum": dict(total), "replicas": {d: len(r) for d, r in replicas.items()}}


def executed(values: dict[tuple[str, str, str], float]) -> dict[tuple[str, str, str], float]:
    """The series of ``parse_node_counts``'s ``count`` or ``sum`` that are executions (outcome ``ok`` or
    ``error``), without the ``not_started`` calls."""
    return {k: v for k, v in values.items() if k[2] in EXECUTED_OUTCOMES}


def model_node_counts(url: str, at_least: int = 0, timeout_s: float = 45.0, settle_polls: int = 2) -> dict[str, Any]:
    """The replicas' node counts once they cover ``at_least`` executions (of any node type; outcomes
    ``ok`` and ``error``, not the ``not_started`` calls) and stopped moving (``settle_polls`` equal
    scrapes in a row); Ray's metrics reach the endpoint every few seconds, so the first scrape may not
    hold the last runs yet. Gives up after ``timeout_s`` with what it last read (``"settled": False``).
    The counts returned keep every outcome: ``executed`` picks the executions."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] | None = None
    same = 0
    while True:
        try:
            cur = parse_node_counts(httpx.get(url, timeout=10).text)
        except httpx.HTTPError:
            cur = None
        if cur is not None:
            runs = sum(executed(cur["count"]).values())
            same = same + 1 if last is not None and cur["count"] == last["count"] else 0
            last = cur
            if runs >= at_least and same >= settle_polls - 1:
                return {**cur, "settled": True}
        if time.monotonic() > deadline:
            return {**(last or {"count": {}, "sum": {}, "replicas": {}}), "settled": False}
        time.sleep(2.5)
