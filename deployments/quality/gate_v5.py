"""``gate-v5``'s learned score: the mask checker's log-odds (``gate_net``) (SPEC.md §13; calibration:
``gate_net.py``'s docstring and ``benchmarks/gate_calibration.py --policy gate-v5``).

``net_bad`` is the network's probability that the mask is bad (IoU under 0.85); the score is its
log-odds, and the mask fails at ``>= threshold``. The reason names the network's predicted IoU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

WORDS: dict[str, tuple[str, str]] = {
    "net_iou": ("a mask checker trained on labelled cut-outs puts its overlap with the subject at {}", "pct"),
}


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class NetScore:
    """``logit(net_bad)``; fail at ``>= threshold``."""

    threshold: float
    words: Mapping[str, tuple[str, str]] = field(default_factory=lambda: dict(WORDS))

    @property
    def features(self) -> tuple[str, ...]:
        return ("net_bad", "net_iou")

    def contributions(self, scores: Mapping[str, float]) -> dict[str, float]:
        """The log-odds past the threshold, under ``net_iou`` (the value a reviewer can read: a failing
        mask's reason always names it)."""
        return {"net_iou": self.score(scores) - self.threshold}

    def score(self, scores: Mapping[str, float]) -> float:
        return logit(scores["net_bad"])

    def probability(self, scores: Mapping[str, float]) -> float:
        return 1.0 / (1.0 + math.exp(-self.score(scores)))


# Calibration: ``benchmarks/gate_calibration.py --policy gate-v5 --seeds 11,12,13 --recall 0.98``.
GATE_V5_SCORE = NetScore(threshold=-2.3905)
