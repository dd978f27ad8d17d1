"""``gate-v5``'s learned score: the mask checker's log-odds (``gate_net``), optionally plus a share of
gate-v4's tree score (SPEC.md §13; calibration: ``gate_net.py``'s docstring and
``benchmarks/gate_calibration.py --policy gate-v5``).

``net_bad`` is the network's probability that the mask is bad (IoU under 0.85); the score is its
log-odds, plus ``tree_weight`` times gate-v4's score when that weight is not 0, and the mask fails at
``>= threshold``. The reason names the network's predicted IoU and, when gate-v4's score is part of it,
the features that pushed that up the most.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from .gate_v2 import Score

WORDS: dict[str, tuple[str, str]] = {
    "net_iou": ("a mask checker trained on labelled cut-outs puts its overlap with the subject at {}", "pct"),
}


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class NetScore:
    """``logit(net_bad) + tree_weight * trees.score``; fail at ``>= threshold``."""

    threshold: float
    trees: Score | None = None
    tree_weight: float = 0.0
    words: Mapping[str, tuple[str, str]] = field(default_factory=lambda: dict(WORDS))

    @property
    def features(self) -> tuple[str, ...]:
        own = ("net_bad", "net_iou")
        return own if self.trees is None or not self.tree_weight else (*own, *self.trees.features)

    def contributions(self, scores: Mapping[str, float]) -> dict[str, float]:
        """The network's log-odds past the threshold under ``net_iou`` (the value a reviewer can read: a
        failing mask's reason always names it), the trees' shares weighted."""
        out = {"net_iou": logit(scores["net_bad"]) - self.threshold}
        if self.trees is not None and self.tree_weight:
            for k, v in self.trees.contributions(scores).items():
                out[k] = out.get(k, 0.0) + self.tree_weight * v
        return out

    def score(self, scores: Mapping[str, float]) -> float:
        own = logit(scores["net_bad"])
        if self.trees is None or not self.tree_weight:
            return own
        return own + self.tree_weight * self.trees.score(scores)

    def probability(self, scores: Mapping[str, float]) -> float:
        return 1.0 / (1.0 + math.exp(-self.score(scores)))


# Calibration: ``benchmarks/gate_calibration.py --policy gate-v5 --seeds 11,12,13 --recall 0.98``.
GATE_V5_SCORE = NetScore(threshold=-2.3905)
