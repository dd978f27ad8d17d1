"""The model deployments' own figures, exported with ``ray.serve.metrics`` next to Serve's.

Ray's metrics agent on each node serves them to Prometheus with Ray's ``ray_`` prefix and Serve's
``deployment``/``replica``/``application`` tags (``ray_hitl_model_node_seconds_bucket{deployment=
"Segmenter", node_type=…}``); ``deploy/grafana/hitl.json`` plots them. The same figures, as this
replica counted them, are in ``describe()`` (``/readyz``'s deployments), so they can be read
without Prometheus.

- ``hitl_model_ongoing_requests`` (gauge): node requests in this replica, queued for the batch or
  computing: the replica's own queue length.
- ``hitl_model_batch_size`` (histogram): images per encoder forward of ``@serve.batch``.
- ``hitl_model_embedding_cache`` (counter, ``result`` = memory_hit, store_hit, miss): the SAM
  embedding cache, per image looked up.
- ``hitl_model_node_seconds`` (histogram, ``node_type``, ``outcome`` = ok, error): node run time
  in the replica, image load and encoder included.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from typing import Any

from ray.serve.metrics import Counter, Gauge, Histogram

NODE_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
BATCH_BUCKETS = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0]
CACHE_RESULTS = ("memory_hit", "store_hit", "miss")


class ModelMetrics:
    """One per replica (Ray's metrics are per process; Serve adds the replica's tags)."""

    def __init__(self) -> None:
        self.ongoing_gauge = Gauge(
            "hitl_model_ongoing_requests", "Node requests in this model replica (queued for a batch or computing)"
        )
        self.batch_hist = Histogram(
            "hitl_model_batch_size", "Images per batched encoder forward (@serve.batch)", boundaries=BATCH_BUCKETS
        )
        self.cache_counter = Counter(
            "hitl_model_embedding_cache", "SAM image-embedding lookups by result", tag_keys=("result",)
        )
        self.node_hist = Histogram(
            "hitl_model_node_seconds",
            "Node run time in the model replica by node type and outcome",
            boundaries=NODE_BUCKETS,
            tag_keys=("node_type", "outcome"),  # type: ignore[arg-type]  # Ray annotates tuple[str]; takes any
        )
        self._lock = threading.Lock()
        self.ongoing = 0
        self.batches: Tally[int] = Tally()  # batch size -> forwards
        self.cache: Tally[str] = Tally()
        self.nodes: Tally[tuple[str, str]] = Tally()  # (node_type, outcome) -> runs
        self.node_seconds: dict[tuple[str, str], float] = {}
        self.ongoing_gauge.set(0)

    def started(self) -> None:
        with self._lock:
            self.ongoing += 1
            self.ongoing_gauge.set(self.ongoing)

    def finished(self, node_type: str, outcome: str, seconds: float) -> None:
        with self._lock:
            self.ongoing -= 1
            self.ongoing_gauge.set(self.ongoing)
            key = (node_type, outcome)
            self.nodes[key] += 1
            self.node_seconds[key] = self.node_seconds.get(key, 0.0) + seconds
        self.node_hist.observe(seconds, tags={"node_type": node_type, "outcome": outcome})

    def batch(self, size: int) -> None:
        with self._lock:
            self.batches[size] += 1
        self.batch_hist.observe(float(size))

    def cache_counts(self, memory_hits: int, store_hits: int, misses: int) -> None:
        """The encoder's running totals; the increase since the last call is recorded."""
        totals = dict(zip(CACHE_RESULTS, (memory_hits, store_hits, misses), strict=True))
        with self._lock:
            deltas = {r: totals[r] - self.cache[r] for r in CACHE_RESULTS}
            self.cache.update(deltas)
        for result, delta in deltas.items():
            if delta > 0:
                self.cache_counter.inc(delta, tags={"result": result})

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "ongoing_requests": self.ongoing,
                "batch_sizes": {str(k): v for k, v in sorted(self.batches.items())},
                "embedding_cache": {r: self.cache[r] for r in CACHE_RESULTS},
                "nodes": {
                    f"{t}:{o}": {"runs": n, "seconds": round(self.node_seconds[(t, o)], 4)}
                    for (t, o), n in sorted(self.nodes.items())
                },
            }
