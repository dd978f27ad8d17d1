"""gate-v3 (SPEC.md §13): the ring-colour-seeded recut on true and broken masks, its determinism and
words, and the policy's verdicts (``deployments/quality/gate_v3.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.cutout_data import make_set
from hitl_review.deployments.backends.base import int_box, make_segmenter
from hitl_review.deployments.quality.gate import POLICIES, judge, score_mask
from hitl_review.deployments.quality.gate_v2 import EXTRA_FEATURES, explain
from hitl_review.deployments.quality.gate_v3 import GATE_V3_SCORE, V3_FEATURES, v3_features
from hitl_review.deployments.quality.metrics import mask_iou
from hitl_review.deployments.quality.subject import QualityGate
from tests.test_quality_gate_v2 import padded, studio_subjects


def learned(scores: dict[str, float]) -> float:
    return GATE_V3_SCORE.score(scores)


def half_of(mask: np.ndarray) -> np.ndarray:
    half = mask.copy()
    half[:, int(np.median(np.nonzero(mask)[1])) :] = False
    return half


def shadow_scene() -> tuple[np.ndarray, list[float], np.ndarray, np.ndarray]:
    """A red bottle-like subject on a light studio gradient with a dark cast shadow at its foot: the
    image, the subject's box, the true mask and the mask that took the shadow in the box in too."""
    h, w = 160, 200
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.empty((h, w, 3), np.float32)
    image[...] = (225 + 15 * xx / w)[..., None]  # a gentle gradient, neutral grey
    subject = ((xx - 85) / 28.0) ** 2 + ((yy - 90) / 35.0) ** 2 <= 1  # the body
    subject |= (abs(xx - 85) <= 8) & (yy >= 38) & (yy < 60)  # the neck: not convex (gate-v2's solidity)
    shadow = (((xx - 100) / 40.0) ** 2 + ((yy - 110) / 30.0) ** 2 <= 1) & ~subject
    image[shadow] *= 0.55
    image[subject] = (200, 40, 35)
    rng = np.random.default_rng(0)
    image += rng.normal(0, 2.0, image.shape)
    box = [54.0, 35.0, 117.0, 128.0]  # the subject's, 3 px loose: the shadow's near half falls inside
    inside = np.zeros_like(subject)
    inside[35:128, 54:117] = True
    return np.clip(image, 0, 255).astype(np.uint8), box, subject, subject | (shadow & inside)


def test_a_true_mask_agrees_with_the_ring_recut() -> None:
    subjects = studio_subjects()
    assert len(subjects) >= 3
    for image, bbox, mask in subjects:
        s = score_mask(image, bbox, mask, gate="gate-v3")
        assert set(V3_FEATURES) <= set(s) and set(EXTRA_FEATURES) <= set(s)
        assert s["ring_recut_iou"] >= 0.8 and s["ring_recut_over"] <= 0.1 and s["ring_recut_under"] <= 0.2, s
        assert 0.0 <= s["stands_out"] <= 1.0


def test_a_broken_mask_disagrees_with_the_ring_recut_on_the_side_it_is_wrong() -> None:
    """Half the subject: the recut (which knows nothing of the mask) reaches well past it; the subject
    with its shadow: the mask reaches well past the recut."""
    for image, bbox, mask in studio_subjects():
        true = score_mask(image, bbox, mask, gate="gate-v3")
        half = score_mask(image, bbox, half_of(mask), gate="gate-v3")
        assert half["ring_recut_iou"] < true["ring_recut_iou"] - 0.2
        assert half["ring_recut_under"] > true["ring_recut_under"] + 0.2
    image, box, subject, with_shadow = shadow_scene()
    true = score_mask(image, box, subject, gate="gate-v3")
    swallowed = score_mask(image, box, with_shadow, gate="gate-v3")
    assert true["ring_recut_iou"] >= 0.85 and true["ring_recut_over"] <= 0.1, true
    assert swallowed["ring_recut_over"] > 0.1 and swallowed["ring_recut_iou"] < true["ring_recut_iou"] - 0.1


def test_the_ring_recut_repeats_whatever_ran_before() -> None:
    """OpenCV's GrabCut draws from a global RNG: the recut seeds it, so a verdict repeats."""
    image, bbox, mask = studio_subjects()[0]
    h, w = mask.shape
    first = v3_features(image, mask, int_box(bbox, w, h))
    make_segmenter("classical").segment(image, "x", [{"box_id": "a", "bbox": bbox}])  # moves the RNG
    assert v3_features(image, mask, int_box(bbox, w, h)) == first
    assert judge(score_mask(image, bbox, mask, gate="gate-v3"), "gate-v3") == judge(
        score_mask(image, bbox, mask, gate="gate-v3"), "gate-v3"
    )


def test_scores_carry_the_features_of_the_policy_asked_for() -> None:
    image, bbox, mask = studio_subjects()[0]
    assert not set(V3_FEATURES) & set(score_mask(image, bbox, mask, gate="gate-v2"))
    assert set(V3_FEATURES) <= set(score_mask(image, bbox, mask))  # no policy named: every feature
    empty = score_mask(image, bbox, np.zeros_like(mask), gate="gate-v3")
    assert all(empty[k] == 0.0 for k in (*V3_FEATURES, *EXTRA_FEATURES))
    with pytest.raises(ValueError, match="score_mask"):
        judge(score_mask(image, bbox, mask, gate="gate-v2"), "gate-v3")  # gate-v2's scores lack gate-v3's


def test_gate_v3_passes_true_masks_and_fails_broken_ones_in_words() -> None:
    for image, bbox, mask in studio_subjects():
        good = score_mask(image, bbox, mask, gate="gate-v3")
        assert learned(good) < GATE_V3_SCORE.threshold
        ok = judge(good, "gate-v3")
        assert ok.verdict == "PASS" and ok.policy == "gate-v3" and ok.severity == 0.0, ok.reasons
        broken = score_mask(image, bbox, half_of(mask), gate="gate-v3")
        assert learned(broken) >= GATE_V3_SCORE.threshold
        bad = judge(broken, "gate-v3")
        assert bad.verdict == "FAIL" and bad.policy == "gate-v3" and bad.severity > 0
        assert len(bad.reasons) == 1 and bad.reasons[0].startswith("the learned score rates this mask likely wrong")
        h, w = mask.shape
        x1, y1, x2, y2 = int_box(bbox, w, h)
        filled = np.zeros_like(mask)
        filled[y1:y2, x1:x2] = True
        filled[y1 + 1 : y2 - 1, x1 + 1 : x2 - 1] = False  # not quite the box: past gate-v1's max_fill
        filled |= mask
        if mask_iou(filled, mask) < 0.8:  # a subject that fills its box: the box is no broken mask
            assert judge(score_mask(image, bbox, filled, gate="gate-v3"), "gate-v3").verdict == "FAIL"
    image, box, subject, with_shadow = shadow_scene()
    assert judge(score_mask(image, box, subject, gate="gate-v3"), "gate-v3").verdict == "PASS"
    # The shadow taken in (IoU 0.85 with the truth) raises the score, but not past the threshold: gate-v3
    # lets this one through (docs/benchmarks.md § Cut-out quality: what it does not see).
    swallowed = score_mask(image, box, with_shadow, gate="gate-v3")
    assert learned(swallowed) > learned(score_mask(image, box, subject, gate="gate-v3")) + 1.0


def test_the_reasons_name_the_new_features_in_words() -> None:
    scores = {k: 0.5 for k in GATE_V3_SCORE.tables}
    scores.update(ring_recut_iou=0.12, ring_recut_over=0.88, ring_recut_under=0.1, stands_out=0.03)
    words = explain(GATE_V3_SCORE, scores, top=len(GATE_V3_SCORE.tables))
    assert "ring_recut" not in words and "stands_out" not in words  # every feature named has its words


def test_the_policy_is_recorded_through_the_segmentation_node() -> None:
    assert POLICIES["gate-v3"].learned is GATE_V3_SCORE and set(V3_FEATURES) & set(GATE_V3_SCORE.tables)
    s = make_set("easy", 2, seed=0)[0]
    h, w = s.image.shape[:2]
    bbox = padded(s.subjects[0].bbox, w, h)
    segmenter = make_segmenter("classical")
    [found] = segmenter.segment(s.image, "x", [{"box_id": "a", "bbox": bbox}])
    kept = QualityGate("gate-v3", 2).check(segmenter, s.image, "x", bbox, found)
    assert kept.quality["policy"] == "gate-v3" and set(V3_FEATURES) <= set(kept.quality["scores"])
    assert all(r["quality"]["policy"] == "gate-v3" for r in kept.refinements)
