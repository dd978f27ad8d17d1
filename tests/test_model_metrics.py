"""The model deployments' own figures (deployments.metrics): what a replica counts, and that the
Grafana dashboard queries them under the names Ray's exporter gives them (``ray_`` prefix;
``_total`` for counters; ``_bucket``/``_sum``/``_count`` for histograms). The recording inside a
real deployment is exercised in tests/test_models_sam.py (batched SAM) and, through Ray's metrics
agent, in tests/test_e2e_serve.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hitl_review.deployments.metrics import ModelMetrics

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "hitl.json"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exported_names(m: ModelMetrics) -> set[str]:
    kinds = {m.ongoing_gauge: "gauge", m.batch_hist: "histogram", m.cache_counter: "counter", m.node_hist: "histogram"}
    return {f"ray_{metric.info['name']}{s}" for metric, kind in kinds.items() for s in SUFFIXES[kind]}


def test_a_replica_counts_queue_nodes_batches_and_cache_deltas():
    m = ModelMetrics()
    m.started()
    m.started()
    assert m.describe()["ongoing_requests"] == 2
    m.finished("DETECT_SUBJECTS", "ok", 0.25)
    m.finished("DETECT_SUBJECTS", "error", 0.5)
    m.batch(3)
    m.cache_counts(memory_hits=2, store_hits=1, misses=3)
    m.cache_counts(memory_hits=5, store_hits=1, misses=3)  # running totals: only the increase counts
    d = m.describe()
    assert d["ongoing_requests"] == 0 and d["batch_sizes"] == {"3": 1}
    assert d["embedding_cache"] == {"memory_hit": 5, "store_hit": 1, "miss": 3}
    assert d["nodes"] == {
        "DETECT_SUBJECTS:error": {"runs": 1, "seconds": 0.5},
        "DETECT_SUBJECTS:ok": {"runs": 1, "seconds": 0.25},
    }


def test_the_dashboard_queries_the_names_ray_exports():
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]
    queried = {n for e in exprs for n in re.findall(r"\bray_hitl_model_[a-z_]+", e)}
    exported = exported_names(ModelMetrics())
    assert len(queried) >= 4, queried
    assert queried <= exported, sorted(queried - exported)
    # queue length, batch size, cache results, latency by node type: each has a panel
    for base in ("ongoing_requests", "batch_size", "embedding_cache", "node_seconds"):
        assert any(f"ray_hitl_model_{base}" in n for n in queried), base
