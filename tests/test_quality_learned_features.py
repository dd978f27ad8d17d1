"""The gate's features beyond gate-v1's (``deployments/quality/learned_features.py``, first measured for
the retired gate-v2; recorded under gate-v5 and a learned file) on true and broken masks, and the words
of a learned score's verdict."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from benchmarks.cutout_data import make_set
from hitl_review.deployments.backends.base import int_box, make_segmenter
from hitl_review.deployments.quality.gate import POLICIES, judge, score_mask
from hitl_review.deployments.quality.learned_features import EXTRA_FEATURES, explain, recut_iou
from hitl_review.deployments.quality.metrics import mask_iou


@dataclass(frozen=True)
class Steps:
    """A learned score for these tests: ``base`` plus, per feature, one value per step (``bisect`` on its
    edges), as the retired gate-v2's was; fail at ``>= threshold``."""

    base: float
    tables: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]]
    threshold: float = 0.0
    words: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(self.tables)

    def contributions(self, scores: Mapping[str, float]) -> dict[str, float]:
        return {k: v[sum(e < scores[k] for e in edges)] for k, (edges, v) in self.tables.items()}

    def score(self, scores: Mapping[str, float]) -> float:
        return self.base + sum(self.contributions(scores).values())

    def probability(self, scores: Mapping[str, float]) -> float:
        return 1.0 / (1.0 + math.exp(-self.score(scores)))


# A learned policy over the extra features (gate-v1's degenerate cases, then the score): what gate-v5
# and a learned file record them under, without gate-v5's network.
LEARNED = replace(
    POLICIES["gate-v5"], version="test-learned", learned=Steps(-9.0, {k: ((), (0.0,)) for k in EXTRA_FEATURES})
)


def half_of(mask: np.ndarray) -> np.ndarray:
    half = mask.copy()
    half[:, int(np.median(np.nonzero(mask)[1])) :] = False
    return half


def padded(bbox: list[float], w: int, h: int, pad: float = 3) -> list[float]:
    return [
        max(0.0, bbox[0] - pad),
        max(0.0, bbox[1] - pad),
        min(float(w), bbox[2] + pad),
        min(float(h), bbox[3] + pad),
    ]


def studio_subjects() -> list[tuple[np.ndarray, list[float], np.ndarray]]:
    """True masks of the easy split on plain backgrounds: what a perturbation should not move."""
    out = []
    for s in make_set("easy", 8, seed=0):
        h, w = s.image.shape[:2]
        if s.background == "plain":
            out += [(s.image, padded(sub.bbox, w, h), sub.mask) for sub in s.subjects]
    return out


def test_a_true_mask_is_stable_under_the_recut_and_stands_out() -> None:
    subjects = studio_subjects()
    assert len(subjects) >= 3
    for image, bbox, mask in subjects:
        s = score_mask(image, bbox, mask, gate=LEARNED)
        assert s["recut_iou"] >= 0.75, s
        assert s["fg_iou_loose"] >= 0.8 and s["outline_fit"] >= 0.6 and s["bg_like"] <= 0.2, s
        assert 0.5 <= s["solidity"] <= 1.1 and 0.0 <= s["edge_share"] <= 1.0 and s["bg_noise"] >= 6.0


def test_a_broken_mask_is_not_stable() -> None:
    """The true mask cut to a half, or grown to its box (background swallowed): the recut (which knows
    nothing of the mask) comes back near the subject, so it agrees far less with the broken mask; the
    box-filling mask of a compact subject can still come close, so that one counts on average."""
    true_recut, filled_recut = [], []
    for image, bbox, mask in studio_subjects():
        h, w = mask.shape
        x1, y1, x2, y2 = int_box(bbox, w, h)
        half = mask.copy()
        half[:, int(np.median(np.nonzero(mask)[1])) :] = False
        true = score_mask(image, bbox, mask, gate=LEARNED)
        broken = score_mask(image, bbox, half, gate=LEARNED)
        assert broken["recut_iou"] < min(0.7, true["recut_iou"] - 0.2), (broken["recut_iou"], true["recut_iou"])
        assert broken["fg_iou_loose"] < true["fg_iou_loose"] - 0.2
        filled = np.zeros_like(mask)
        filled[y1:y2, x1:x2] = True
        if mask_iou(filled, mask) < 0.8:  # a subject that fills its box: the box is no broken mask
            filled_recut.append(score_mask(image, bbox, filled, gate=LEARNED)["recut_iou"])
            true_recut.append(true["recut_iou"])
    assert len(filled_recut) >= 3 and np.mean(filled_recut) < np.mean(true_recut) - 0.1


def test_the_recut_repeats_whatever_ran_before() -> None:
    """OpenCV's GrabCut draws from a global RNG: the recut seeds it, so a verdict repeats."""
    image, bbox, mask = studio_subjects()[0]
    h, w = mask.shape
    first = recut_iou(image, mask, int_box(bbox, w, h))
    make_segmenter("classical").segment(image, "x", [{"box_id": "a", "bbox": bbox}])  # moves the RNG
    assert recut_iou(image, mask, int_box(bbox, w, h)) == first


def test_scores_carry_the_features_of_the_policy_asked_for() -> None:
    image, bbox, mask = studio_subjects()[0]
    v1 = score_mask(image, bbox, mask, gate="gate-v1")
    assert not set(EXTRA_FEATURES) & set(v1)
    assert set(EXTRA_FEATURES) <= set(score_mask(image, bbox, mask, gate=LEARNED))
    assert set(EXTRA_FEATURES) <= set(score_mask(image, bbox, mask))  # no policy named: every feature
    empty = score_mask(image, bbox, np.zeros_like(mask), gate=LEARNED)
    assert all(empty[k] == 0.0 for k in EXTRA_FEATURES) and empty["box_gap"] == 1.0
    with pytest.raises(ValueError, match="score_mask"):
        judge(v1, LEARNED)  # gate-v1's scores lack what a learned score reads


def test_a_learned_score_s_verdict_is_said_in_words() -> None:
    learned = Steps(
        base=-1.0, tables={"recut_iou": ((0.5, 0.9), (2.0, 0.5, -1.0)), "bg_like": ((0.1,), (-0.5, 1.5))}, threshold=0.0
    )
    good = {"recut_iou": 0.95, "bg_like": 0.0}
    assert learned.contributions(good) == {"recut_iou": -1.0, "bg_like": -0.5}
    assert learned.score(good) == pytest.approx(-2.5)
    assert learned.score({"recut_iou": 0.5, "bg_like": 0.1}) == pytest.approx(0.5)  # on an edge: the step below
    bad = {"recut_iou": 0.3, "bg_like": 0.4}
    assert learned.score(bad) == pytest.approx(2.5) and learned.probability(bad) == pytest.approx(0.924, abs=1e-3)
    faint = Steps(base=0.5, tables={"bg_like": ((0.1,), (-0.1, 0.1))}, threshold=0.0)
    assert explain(faint, {"bg_like": 0.4}).endswith("limit 50%)")  # a step under SAY_FROM is not named
    words = explain(learned, bad)
    assert words.startswith("the learned score rates this mask likely wrong (92%")
    assert (
        "coarser cut of the same box overlaps it by only 30%" in words
        and "40% of it looks like the background" in words
    )
