"""Cut-out quality (SPEC.md §13): the mask metrics on hand-made masks, the labelled data set's
determinism and shapes, the quality gate on true and clearly broken masks, and a smoke run of
``benchmarks/cutout_quality.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.cutout_data import SPLITS, make_sample, make_set
from hitl_review.deployments.quality.gate import DEFAULT_POLICY, POLICIES, judge, policy, score_mask
from hitl_review.deployments.quality.metrics import boundary_f, mask_iou

ROOT = Path(__file__).parent.parent


def square(h: int = 60, w: int = 80, y: int = 15, x: int = 20, side: int = 30) -> np.ndarray:
    m = np.zeros((h, w), bool)
    m[y : y + side, x : x + side] = True
    return m


# --------------------------------------------------------------------------- metrics


def test_identical_masks_score_one_and_disjoint_zero() -> None:
    a = square()
    assert mask_iou(a, a) == 1.0 and boundary_f(a, a) == 1.0
    b = square(y=0, x=55, side=5)
    assert mask_iou(a, b) == 0.0 and boundary_f(a, b) == 0.0


def test_a_one_pixel_shift_costs_iou_but_not_boundary_f_within_two_pixels() -> None:
    a = square()
    b = np.roll(a, 1, axis=1)
    assert mask_iou(a, b) == pytest.approx(29 * 30 / (31 * 30))
    assert boundary_f(a, b, tol_px=2) == 1.0
    assert boundary_f(a, b, tol_px=0) < 0.6  # only the top and bottom rows still coincide
    assert boundary_f(a, np.roll(a, 4, axis=1), tol_px=2) < 0.6


def test_half_a_mask_and_empty_masks() -> None:
    a = square()
    half = a.copy()
    half[:, 35:] = False
    assert mask_iou(half, a) == pytest.approx(0.5)
    assert 0.3 < boundary_f(half, a) < 0.9
    empty = np.zeros_like(a)
    assert mask_iou(empty, empty) == 1.0 and boundary_f(empty, empty) == 1.0
    assert mask_iou(empty, a) == 0.0 and boundary_f(empty, a) == 0.0
    with pytest.raises(ValueError):
        mask_iou(a, a[:10])


# --------------------------------------------------------------------------- data set


@pytest.mark.parametrize("split", SPLITS)
def test_the_data_set_is_deterministic_per_seed_and_labels_fit_the_images(split: str) -> None:
    one, two = make_set(split, 6, seed=3), make_set(split, 6, seed=3)
    assert len(one) == len(two) >= 5
    for s, t in zip(one, two, strict=True):
        assert np.array_equal(s.image, t.image)
        assert [sub.bbox for sub in s.subjects] == [sub.bbox for sub in t.subjects]
        assert all(np.array_equal(a.mask, b.mask) for a, b in zip(s.subjects, t.subjects, strict=True))
        h, w = s.image.shape[:2]
        assert s.image.dtype == np.uint8 and s.image.shape == (h, w, 3)
        seen = np.zeros((h, w), bool)
        for sub in s.subjects:
            assert sub.mask.shape == (h, w) and sub.mask.dtype == bool and sub.mask.any()
            ys, xs = np.nonzero(sub.mask)
            assert sub.bbox == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]  # tight
            assert not (seen & sub.mask).any()  # a hidden part belongs to the subject in front only
            seen |= sub.mask
    other = make_set(split, 6, seed=4)
    assert not np.array_equal(one[0].image, other[0].image)
    # one image rebuilds alone, the same as in its set
    assert np.array_equal(make_sample(split, 2, seed=3).image, one[[s.index for s in one].index(2)].image)


def test_the_hard_split_is_harder_than_the_easy_one() -> None:
    easy, hard = make_set("easy", 20, seed=0), make_set("hard", 20, seed=0)
    assert {s.background for s in easy} <= {"plain", "gradient"}
    assert {"cluttered", "low_contrast"} <= {s.background for s in hard}
    assert sum(len(s.subjects) for s in hard) > sum(len(s.subjects) for s in easy)
    with pytest.raises(ValueError, match="easy, hard"):
        make_set("medium", 1, seed=0)


# --------------------------------------------------------------------------- gate


def padded(bbox: list[float], w: int, h: int, pad: float = 3) -> list[float]:
    return [
        max(0.0, bbox[0] - pad),
        max(0.0, bbox[1] - pad),
        min(float(w), bbox[2] + pad),
        min(float(h), bbox[3] + pad),
    ]


def easy_subjects() -> list[tuple[np.ndarray, list[float], np.ndarray]]:
    out = []
    for s in make_set("easy", 6, seed=0):
        h, w = s.image.shape[:2]
        out += [(s.image, padded(sub.bbox, w, h), sub.mask) for sub in s.subjects]
    return out


def test_the_gate_passes_true_masks() -> None:
    subjects = easy_subjects()
    assert len(subjects) >= 6
    for image, bbox, mask in subjects:
        verdict = judge(score_mask(image, bbox, mask))
        assert verdict.verdict == "PASS", verdict.reasons
        assert verdict.reasons == [] and verdict.policy == DEFAULT_POLICY


def test_the_gate_fails_clearly_bad_masks_with_reasons() -> None:
    for image, bbox, mask in easy_subjects():
        x1, y1, x2, y2 = (int(v) for v in bbox)
        ys, xs = np.nonzero(mask)
        half = mask.copy()
        half[:, int(np.median(xs)) :] = False
        filled = np.zeros_like(mask)
        filled[y1:y2, x1:x2] = True
        cut_at = int(ys.min() + 0.5 * (ys.max() - ys.min()))  # a box drawn too low: the top half is cut
        cut_box = [float(x1), float(cut_at), float(x2), float(y2)]
        cut = mask.copy()
        cut[:cut_at] = False
        for name, box, bad in (
            ("half", bbox, half),
            ("filled", bbox, filled),
            ("cut", cut_box, cut),
            ("empty", bbox, np.zeros_like(mask)),
        ):
            verdict = judge(score_mask(image, box, bad))
            assert verdict.verdict == "FAIL", (name, verdict.scores)
            assert verdict.reasons and all(isinstance(r, str) and len(r) > 20 for r in verdict.reasons)
            expected = {"half": "only part of the subject", "filled": "it is the box", "cut": "cut off"}.get(name)
            if expected:
                assert any(expected in r for r in verdict.reasons), (name, verdict.reasons)
            if name == "empty":
                assert verdict.reasons == ["the mask is empty: nothing was cut out"]
        d = verdict.to_dict()
        assert d["verdict"] == "FAIL" and d["policy"] == "gate-v1" and d["scores"]["fill"] == 0.0


def test_scores_are_cheap_features_in_range() -> None:
    image, bbox, mask = easy_subjects()[0]
    scores = score_mask(image, bbox, mask, predicted_iou=0.9, stability=0.8)
    assert scores["predicted_iou"] == 0.9 and scores["stability"] == 0.8
    for key in ("fill", "box_gap", "box_agreement", "edge_touch", "cut_off", "largest_share", "bg_closer"):
        assert 0.0 <= scores[key] <= 1.0, key
    assert scores["components"] == 1.0 and scores["contrast"] > 0 and scores["edge_alignment"] > 1


def test_an_unknown_policy_names_the_known_ones() -> None:
    assert policy() is POLICIES[DEFAULT_POLICY] and policy("gate-v1").version == "gate-v1"
    with pytest.raises(ValueError, match="gate-v1"):
        policy("gate-v0")
    with pytest.raises(ValueError, match="unknown quality-gate policy"):
        judge({"fill": 0.5}, "nope")


# --------------------------------------------------------------------------- benchmark


def test_the_benchmark_quick_run_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "cq.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/cutout_quality.py", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,  # gate-v5's network: ~25 s of CPU, minutes on a loaded machine
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gate recall" in proc.stdout and "all gate-v5/gate-v1" in proc.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "cutout_quality" and data["policies"] == ["gate-v1", "gate-v5"]
    assert data["baseline"] == "gate-v1" and data["default_policy"] == DEFAULT_POLICY
    for version in data["policies"]:
        per = data["results"][version]["classical"]
        assert set(per) == {"easy", "hard", "all"}
        assert per["all"]["subjects"] == per["easy"]["subjects"] + per["hard"]["subjects"] > 0
        for r in per.values():
            for key in ("mean_iou", "mean_bf_2px", "mean_iou_after_refinement", "mean_bf_2px_after_refinement"):
                assert 0.0 <= r[key] <= 1.0, key
            for key in ("gate_precision", "gate_recall", "to_person_share"):
                assert r[key] is None or 0.0 <= r[key] <= 1.0, key
            assert r["ms_per_subject"]["total"] > 0 and r["ms_per_subject"]["gate"] > 0
            assert r["refinements"] <= 2 * r["gate_failed"] and r["refinement_errors"] == 0
        assert per["easy"]["mean_iou"] > 0.9
        names = {t["name"] for t in data["targets"][version]}
        assert names >= {"classical, all subjects: gate recall at IoU < 0.85"}
    v1, v2 = (data["results"][v]["classical"]["all"] for v in ("gate-v1", "gate-v5"))
    assert v1["mean_iou"] == v2["mean_iou"] and v1["bad_masks"] == v2["bad_masks"]  # the same first masks
    ratio = data["ratios"]["gate-v5"]["classical"]["all"]
    assert ratio["ms_gate"] == pytest.approx(v2["ms_per_subject"]["gate"] / v1["ms_per_subject"]["gate"], abs=0.01)
    assert set(ratio) >= {"gate_precision", "gate_recall", "escaped", "to_person_share", "ms_total"}
