"""gate-v4 (SPEC.md §13): the box-margin features in pixels, the depth-2 tree score, the policy by name,
its determinism and words (``deployments/quality/gate_v4.py``, ``gate_v4_model.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.cutout_data import make_set
from hitl_review.deployments.backends.base import make_segmenter
from hitl_review.deployments.quality.gate import POLICIES, judge, policy, score_mask
from hitl_review.deployments.quality.gate_v2 import explain
from hitl_review.deployments.quality.gate_v3 import V3_FEATURES
from hitl_review.deployments.quality.gate_v4 import GAP_FEATURES, SHORT_PX, TreeScore, gap_features
from hitl_review.deployments.quality.gate_v4_model import GATE_V4_SCORE
from hitl_review.deployments.quality.subject import QualityGate
from tests.test_quality_gate_v2 import padded, studio_subjects
from tests.test_quality_gate_v3 import half_of


def test_gap_features_measure_the_margins_in_pixels() -> None:
    box = (10, 20, 110, 80)
    assert gap_features([10.0, 20.0, 110.0, 80.0], box) == {
        "gap_px_max": 0.0,
        "gap_px_second": 0.0,
        "gap_px_sum": 0.0,
        "sides_short": 0.0,
    }
    # 30 px short on the right, 4 px at the top (within SHORT_PX), 8 px at the bottom
    got = gap_features([10.0, 24.0, 80.0, 72.0], box)
    assert got == {"gap_px_max": 30.0, "gap_px_second": 8.0, "gap_px_sum": 42.0, "sides_short": 2.0}
    assert SHORT_PX < 8
    # a mask past the box counts no negative margin; an empty one is short everywhere
    assert gap_features([0.0, 0.0, 200.0, 100.0], box)["gap_px_sum"] == 0.0
    assert gap_features(None, box)["sides_short"] == 4.0


def test_gap_features_on_a_drawn_mask_through_score_mask() -> None:
    image = np.full((120, 160, 3), 230, np.uint8)
    mask = np.zeros((120, 160), bool)
    mask[30:90, 40:100] = True
    image[mask] = (200, 30, 30)
    whole = score_mask(image, [38.0, 28.0, 102.0, 92.0], mask, gate="gate-v4")
    assert whole["gap_px_max"] == 2.0 and whole["sides_short"] == 0.0
    cut = mask.copy()
    cut[:, 70:] = False  # the right half missing: 32 px short of the box's right side
    part = score_mask(image, [38.0, 28.0, 102.0, 92.0], cut, gate="gate-v4")
    assert part["gap_px_max"] == 32.0 and part["sides_short"] == 1.0


def test_tree_score_adds_its_leaves_and_splits_them_among_the_features() -> None:
    trees = ((0, 0.5, (1, 2.0, 1.0, -1.0), (-1, 0.0, 0.25, 0.25)), (1, 3.0, (-1, 0.0, -0.5, -0.5), (0, 0.1, 2.0, 4.0)))
    score = TreeScore(names=("a", "b", "c"), base=-1.0, trees=trees, threshold=0.0)
    assert score.features == ("a", "b")
    s = {"a": 0.2, "b": 1.0, "c": 9.0}
    assert score.score(s) == pytest.approx(-1.0 + 1.0 - 0.5)
    s2 = {"a": 0.7, "b": 5.0, "c": 9.0}
    assert score.score(s2) == pytest.approx(-1.0 + 0.25 + 4.0)
    for x in (s, s2):
        parts = score.contributions(x)
        assert set(parts) == {"a", "b"} and sum(parts.values()) == pytest.approx(score.score(x) - score.base)
    assert score.contributions(s2) == pytest.approx({"a": 0.25 + 2.0, "b": 2.0})
    assert 0 < score.probability(s) < 0.5 < score.probability(s2) < 1


def test_gate_v4_is_a_policy_by_name_and_its_scores_carry_its_features() -> None:
    p = policy("gate-v4")
    assert p is POLICIES["gate-v4"] and p.version == "gate-v4" and p.learned is GATE_V4_SCORE
    assert set(GAP_FEATURES) <= set(GATE_V4_SCORE.features) and set(GATE_V4_SCORE.features) <= set(GATE_V4_SCORE.names)
    assert QualityGate("gate-v4", 2).policy == "gate-v4"
    image, bbox, mask = studio_subjects()[0]
    s = score_mask(image, bbox, mask, gate="gate-v4")
    assert set(GATE_V4_SCORE.features) <= set(s) and set(V3_FEATURES) <= set(s)
    # the older policies' scores (recorded verdicts name them) stay as they were: no gate-v4 features
    assert not set(GAP_FEATURES) & set(score_mask(image, bbox, mask, gate="gate-v3"))
    assert set(GAP_FEATURES) <= set(score_mask(image, bbox, mask))  # no policy named: every feature
    with pytest.raises(ValueError, match="score_mask"):
        judge(score_mask(image, bbox, mask, gate="gate-v3"), "gate-v4")
    empty = judge(score_mask(image, bbox, np.zeros_like(mask), gate="gate-v4"), "gate-v4")
    assert empty.verdict == "FAIL" and empty.policy == "gate-v4"


def test_the_same_mask_judged_twice_gets_the_same_verdict() -> None:
    image, bbox, mask = studio_subjects()[0]
    first = judge(score_mask(image, bbox, mask, gate="gate-v4"), "gate-v4")
    make_segmenter("classical").segment(image, "x", [{"box_id": "a", "bbox": bbox}])  # moves OpenCV's RNG
    again = judge(score_mask(image, bbox, mask, gate="gate-v4"), "gate-v4")
    assert first == again
    broken = half_of(mask)
    assert judge(score_mask(image, bbox, broken, gate="gate-v4"), "gate-v4") == judge(
        score_mask(image, bbox, broken, gate="gate-v4"), "gate-v4"
    )


def test_gate_v4_passes_true_masks_and_fails_broken_ones_in_words() -> None:
    for image, bbox, mask in studio_subjects():
        ok = judge(score_mask(image, bbox, mask, gate="gate-v4"), "gate-v4")
        assert ok.verdict == "PASS" and ok.severity == 0.0, ok.reasons
        bad = judge(score_mask(image, bbox, half_of(mask), gate="gate-v4"), "gate-v4")
        assert bad.verdict == "FAIL" and bad.policy == "gate-v4" and bad.severity > 0
        assert len(bad.reasons) == 1 and bad.reasons[0].startswith("the learned score rates this mask likely wrong")


def test_the_reasons_name_every_feature_in_words() -> None:
    scores = {k: 0.5 for k in GATE_V4_SCORE.names}
    scores.update(gap_px_max=40.0, gap_px_second=30.0, gap_px_sum=90.0, sides_short=3.0, fill=0.3)
    assert set(GATE_V4_SCORE.features) <= set(GATE_V4_SCORE.words)  # every feature it splits on has words
    words = explain(GATE_V4_SCORE, scores, top=len(GATE_V4_SCORE.features))
    assert "stops short of 3 sides of the box" in words and "gap_px" not in words and "sides_short" not in words


def test_the_policy_is_recorded_through_the_segmentation_node() -> None:
    s = make_set("easy", 2, seed=0)[0]
    h, w = s.image.shape[:2]
    bbox = padded(s.subjects[0].bbox, w, h)
    segmenter = make_segmenter("classical")
    [found] = segmenter.segment(s.image, "x", [{"box_id": "a", "bbox": bbox}])
    kept = QualityGate("gate-v4", 2).check(segmenter, s.image, "x", bbox, found)
    assert kept.quality["policy"] == "gate-v4" and set(GAP_FEATURES) <= set(kept.quality["scores"])
