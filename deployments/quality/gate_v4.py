"""``gate-v4``: gate-v3's features, four more about how far the mask stops short of its box, and a score
of depth-2 trees (SPEC.md §13; the calibration is in ``gate.py``'s docstring and
``benchmarks/gate_calibration.py --policy gate-v4``).

Features (``gap_features``), from the mask's own bounding box and the box, in image pixels: a box is
drawn tight around its subject (a detector's, a reviewer's: a few pixels loose), so a mask whose extent
stops well short of a side has missed a part (a lamp's foot, a chair's leg, the far side of a ring),
however small a share of the box that part is (gate-v1's ``box_gap`` is the share):

- ``gap_px_max``, ``gap_px_second``: the widest and the second widest empty margin between the mask's
  extent and a side of the box (capped at 99);
- ``gap_px_sum``: the four margins together (capped at 396);
- ``sides_short``: how many sides the mask stops more than ``SHORT_PX`` pixels short of.

Calibrated on the benchmark's boxes (the true box moved out by -1 to 5 px per side, images about
370 x 270): on much larger pictures, or with looser boxes, the pixel margins mean something else and
the score must be calibrated again.

``TreeScore`` is the learned score: a sum of small trees, each splitting on one feature and then, on
each side, on another (boosted with a logistic loss, as gate-v2's stumps, but a tree can say that a
feature matters only when another is low: a faint outline only when the mask also stops short).
Plain numbers in ``gate_v4_model.py``, written by the calibration; no model library at run time. The
threshold is set on scores the model gave to calibration images it was not fitted on (each seed left
out in turn), not on its own training images, where trees look better than they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SHORT_PX = 6  # a side is "short" past this many pixels (the benchmark's boxes are 1 px tight to 5 px loose)

GAP_FEATURES: tuple[str, ...] = ("gap_px_max", "gap_px_second", "gap_px_sum", "sides_short")

WORDS: dict[str, tuple[str, str]] = {
    "gap_px_max": ("its extent stops {} px short of a side of the box", "int"),
    "gap_px_second": ("its extent stops {} px short of a second side of the box", "int"),
    "gap_px_sum": ("its extent stops {} px short of the box's sides in all", "int"),
    "sides_short": ("it stops short of {} sides of the box", "int"),
}

_EMPTY = {"gap_px_max": 99.0, "gap_px_second": 99.0, "gap_px_sum": 396.0, "sides_short": 4.0}


def gap_features(extent: Sequence[float] | None, box: Sequence[float]) -> dict[str, float]:
    """``GAP_FEATURES`` of a mask whose bounding box is ``extent`` (``x1, y1, x2, y2``, far sides
    exclusive; None for an empty mask) in the box ``box`` (the same frame, integer pixels)."""
    if extent is None:
        return dict(_EMPTY)
    x1, y1, x2, y2 = box
    gaps = sorted(
        (max(0.0, extent[0] - x1), max(0.0, x2 - extent[2]), max(0.0, extent[1] - y1), max(0.0, y2 - extent[3])),
        reverse=True,
    )
    return {
        "gap_px_max": float(min(99.0, gaps[0])),
        "gap_px_second": float(min(99.0, gaps[1])),
        "gap_px_sum": float(min(396.0, sum(gaps))),
        "sides_short": float(sum(g > SHORT_PX for g in gaps)),
    }


# One tree: (feature, edge, low side, high side); a side: (feature, edge, value at or below, value above),
# feature -1 for a leaf (both values the same). A value at or below an edge goes to the low side.
Side = tuple[int, float, float, float]
Tree = tuple[int, float, Side, Side]


@dataclass(frozen=True)
class TreeScore:
    """An additive logistic score: ``base`` plus every tree's leaf value, the features indexed into
    ``names``; fail at ``>= threshold``. ``words``: ``gate_v2.explain``'s phrases for its features."""

    names: tuple[str, ...]
    base: float
    trees: tuple[Tree, ...]
    threshold: float
    words: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def features(self) -> tuple[str, ...]:
        """The features the trees split on (those ``score`` reads)."""
        used = {j for j, _, lo, hi in self.trees for j in (j, lo[0], hi[0]) if j >= 0}
        return tuple(n for i, n in enumerate(self.names) if i in used)

    def _leaves(self, scores: Mapping[str, float]) -> list[tuple[int, int, float]]:
        out = []
        for j, edge, lo, hi in self.trees:
            j2, edge2, below, above = lo if scores[self.names[j]] <= edge else hi
            value = below if j2 < 0 or scores[self.names[j2]] <= edge2 else above
            out.append((j, j2, value))
        return out

    def score(self, scores: Mapping[str, float]) -> float:
        return self.base + math.fsum(v for _, _, v in self._leaves(scores))

    def probability(self, scores: Mapping[str, float]) -> float:
        return 1.0 / (1.0 + math.exp(-self.score(scores)))

    def contributions(self, scores: Mapping[str, float]) -> dict[str, float]:
        """Each feature's share of the score: a tree's value split evenly between the features on its path."""
        out = dict.fromkeys(self.features, 0.0)
        for j, j2, value in self._leaves(scores):
            path = [j] if j2 < 0 or j2 == j else [j, j2]
            for i in path:
                out[self.names[i]] += value / len(path)
        return out
