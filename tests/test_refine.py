"""``REFINE_SUBJECT``'s strategies (SPEC §13) on composites whose true masks are known.

The classical segmenter stands for "a segmenter" (it implements ``segment_prompt`` for real);
a recording fake checks what each strategy asks the segmenter for, and the tiny random-weight
SAM that every strategy runs through it. Masks are compared with the truth by IoU."""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from hitl_review.deployments.backends import sam as S
from hitl_review.deployments.backends.classical import ClassicalSegmenter
from hitl_review.deployments.quality.metrics import mask_iou
from hitl_review.deployments.quality.refine import STRATEGIES, cut_sides, grown_box, mask_points, pick_other, refine

H, W = 300, 400


def scene(shape: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """One shaded object on a studio background with light fall-off and noise: image, truth, tight box."""
    rng = np.random.default_rng(seed)
    img = np.full((H, W, 3), 232.0) + np.linspace(-6, 6, H)[:, None, None]
    truth = np.zeros((H, W), np.uint8)
    if shape == "ellipse":
        cv2.ellipse(truth, (200, 150), (100, 70), 10, 0, 360, 1, -1)
    else:
        cv2.rectangle(truth, (120, 90), (280, 210), 1, -1)
    m = truth.astype(bool)
    obj = np.array([150.0, 60.0, 40.0])[None, None, :] * np.linspace(1.15, 0.85, H)[:, None, None]
    img[m] = np.broadcast_to(obj, img.shape)[m]
    img = np.clip(img + rng.normal(0, 3, img.shape), 0, 255).astype(np.uint8)
    ys, xs = np.nonzero(m)
    return img, m, [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


def box_mask(bbox: list[float]) -> np.ndarray:
    """The pixels a box covers (a partly covered pixel counts, as the backends clip)."""
    m = np.zeros((H, W), bool)
    x1, y1, x2, y2 = math.floor(bbox[0]), math.floor(bbox[1]), math.ceil(bbox[2]), math.ceil(bbox[3])
    m[y1:y2, x1:x2] = True
    return m


@pytest.fixture(scope="module")
def seg() -> ClassicalSegmenter:
    return ClassicalSegmenter()


@pytest.fixture(scope="module")
def ellipse() -> tuple[np.ndarray, np.ndarray, list[float]]:
    return scene("ellipse")


class Recorder:
    """A PromptedSegmenter that returns fixed candidates and records every prompt it gets."""

    name = "recorder"

    def __init__(self, candidates: list[dict[str, Any]]) -> None:
        self.candidates = candidates
        self.calls: list[dict[str, Any]] = []

    def segment_prompt(self, image, image_sha, bbox, points, *, multimask=False):
        self.calls.append({"bbox": list(bbox), "points": list(points), "multimask": multimask})
        return self.candidates if multimask else self.candidates[:1]


def cand(mask: np.ndarray, iou: float | None = None, stability: float | None = None) -> dict[str, Any]:
    return {"mask": mask, "predicted_iou": iou, "stability": stability}


# --------------------------------------------------------------------------- the contract


@pytest.mark.parametrize("attempt", [0, len(STRATEGIES) + 1, -1, True, 1.0, "1"])
def test_attempts_outside_the_strategies_raise(seg, ellipse, attempt):
    img, truth, box = ellipse
    with pytest.raises(ValueError, match=rf"outside 1\.\.{len(STRATEGIES)}.*goes to a person"):
        refine(seg, img, "e", box, truth, attempt)


def test_bad_inputs_raise(seg, ellipse):
    img, truth, box = ellipse
    with pytest.raises(ValueError, match="image's size 300x400"):
        refine(seg, img, "e", box, truth[:, :-1], 1)
    with pytest.raises(ValueError, match="outside the 400x300 image"):
        refine(seg, img, "e", [0, 0, 500, 10], truth, 1)


def test_strategies_are_the_four_of_the_spec_in_a_fixed_order():
    assert STRATEGIES == ("enlarged_box", "alt_multimask", "mask_points", "edge_grabcut")


def test_each_strategy_replaces_a_mask_that_fills_its_box(seg, ellipse):
    """A mask that is its whole box (a common SAM failure on a busy box): every strategy gives a
    full-size bool mask that is another mask, closer to the truth."""
    img, truth, box = ellipse
    failed = box_mask(box)
    before = mask_iou(failed, truth)
    for attempt, name in enumerate(STRATEGIES, 1):
        r = refine(seg, img, "e", box, failed, attempt)
        assert set(r) == {"mask", "strategy", "bbox", "predicted_iou", "stability"}
        assert r["strategy"] == name
        # The box prompted: the grown one for the strategies that grow it, else the box given.
        assert (r["bbox"] == box) == (name in ("alt_multimask", "mask_points")), (name, r["bbox"], box)
        assert r["mask"].shape == (H, W) and r["mask"].dtype == bool
        assert r["predicted_iou"] is None and r["stability"] is None  # classical and GrabCut: no scores
        assert mask_iou(r["mask"], failed) < 0.9, name
        assert mask_iou(r["mask"], truth) > max(0.95, before + 0.05), name


@pytest.mark.parametrize("shape", ["ellipse", "rect"])
def test_a_mask_cut_at_the_box_edge_is_improved(seg, shape):
    """The box was drawn a quarter short on the right, so the mask stops at the box's edge. The
    strategies that grow the box mend it; those that keep the box stay inside it."""
    img, truth, box = scene(shape, seed=1)
    x1, y1, x2, y2 = box
    cut = [x1, y1, x2 - 0.25 * (x2 - x1), y2]
    failed = seg.segment(img, "c", [{"box_id": "a", "bbox": cut}])[0]["mask"]
    before = mask_iou(failed, truth)
    assert 0.6 < before < 0.85
    after = {name: refine(seg, img, "c", cut, failed, i)["mask"] for i, name in enumerate(STRATEGIES, 1)}
    for name in ("enlarged_box", "edge_grabcut"):
        assert mask_iou(after[name], truth) > max(0.9, before + 0.1), name
    inside = box_mask(cut)
    for name in ("alt_multimask", "mask_points"):
        assert not (after[name] & ~inside).any(), name


# --------------------------------------------------------------------------- what each strategy asks for


def test_enlarged_box_grows_the_sides_that_cut_the_subject():
    img, truth, box = scene("rect")
    # A tight box touches the subject on every side without cutting it.
    assert not any(cut_sides(img, truth, box).values())
    x1, y1, x2, y2 = box
    cut = [x1, y1, x2 - 40, y2]
    failed = truth & box_mask(cut)
    assert cut_sides(img, failed, cut) == {"left": False, "top": False, "right": True, "bottom": False}
    bw, bh = cut[2] - cut[0], cut[3] - cut[1]
    grown = grown_box(img, failed, cut)
    np.testing.assert_allclose(grown, [x1 - 0.05 * bw, y1 - 0.05 * bh, cut[2] + 0.25 * bw, y2 + 0.05 * bh])
    rec = Recorder([cand(truth)])
    r = refine(rec, img, "r", cut, failed, 1)
    assert rec.calls == [{"bbox": grown, "points": [], "multimask": False}] and r["mask"] is truth
    # A side on the image's edge never counts as cut: there is nothing past it.
    left = [0.0, y1, 150.0, y2]
    shifted = np.roll(img, -120, axis=1)
    shifted_truth = np.roll(truth, -120, axis=1)
    assert cut_sides(shifted, shifted_truth & box_mask(left), left)["left"] is False
    assert grown_box(shifted, shifted_truth & box_mask(left), left)[0] == 0.0


def test_alt_multimask_takes_the_best_scored_candidate_that_is_not_the_failed_one(ellipse):
    img, truth, box = ellipse
    failed = truth.copy()
    a = box_mask(box)
    b = truth & box_mask([box[0], box[1], box[2], (box[1] + box[3]) / 2])
    rec = Recorder([cand(failed.copy(), 0.95, 0.95), cand(a, 0.9, 0.5), cand(b, 0.7, 0.9)])
    r = refine(rec, img, "e", box, failed, 2)
    assert rec.calls[0]["multimask"] is True and rec.calls[0]["points"] == []
    assert r["mask"] is b and (r["predicted_iou"], r["stability"]) == (0.7, 0.9)  # 0.63 beats 0.45
    # No scores (classical): the segmenter's order decides.
    assert pick_other([cand(failed), cand(a), cand(b)], failed)["mask"] is a
    # Every candidate is the failed mask again: the best of them, for the gate to judge.
    same = [cand(failed.copy(), 0.5, 0.5), cand(failed.copy(), 0.8, 0.9)]
    assert pick_other(same, failed) is same[1]


def test_mask_points_reads_the_failed_mask():
    img, truth, box = scene("ellipse")
    fragment = truth.copy()
    fragment[:, 200:] = False  # the left half of the object
    points = mask_points(img, fragment, box)
    positive = [p for p in points if p["positive"]]
    negative = [p for p in points if not p["positive"]]
    assert len(positive) == 1
    px, py = int(positive[0]["x"]), int(positive[0]["y"])
    dist = cv2.distanceTransform(fragment.astype(np.uint8), cv2.DIST_L2, 5)
    assert fragment[py, px] and dist[py, px] >= 0.95 * dist.max()  # the most interior pixel
    assert len(negative) == 4  # an ellipse leaves its box's corners to the background
    for p in negative:
        assert not truth[int(p["y"]), int(p["x"])]
    # A rectangle fills its box's corners: no negative point may land on it, however the mask failed.
    img_r, truth_r, box_r = scene("rect")
    frag_r = truth_r.copy()
    frag_r[:, 200:] = False
    assert [p["positive"] for p in mask_points(img_r, frag_r, box_r)] == [True]
    # An empty failed mask: the box's centre.
    empty = mask_points(img, np.zeros((H, W), bool), box)
    assert empty[0] == {"x": (box[0] + box[2]) / 2, "y": (box[1] + box[3]) / 2, "positive": True}


def test_mask_points_mends_a_fragment(seg):
    img, truth, box = scene("rect", seed=2)
    fragment = truth.copy()
    fragment[:, 200:] = False
    r = refine(seg, img, "f", box, fragment, STRATEGIES.index("mask_points") + 1)
    assert mask_iou(fragment, truth) < 0.55 and mask_iou(r["mask"], truth) > 0.95


# --------------------------------------------------------------------------- through SAM


def test_every_strategy_runs_through_sam(ellipse):
    torch.manual_seed(0)
    model = S.SamModel(S.build_sam_vit_tiny(), "vit_tiny", "refine-test", device="cpu")
    sam = S.SamSegmenter(encoder=S.SamEncoder(model))
    img, truth, box = ellipse
    failed = box_mask(box)
    for attempt, name in enumerate(STRATEGIES, 1):
        r = refine(sam, img, "sam-e", box, failed, attempt)
        assert r["strategy"] == name and r["mask"].shape == (H, W) and r["mask"].dtype == bool
        if name == "edge_grabcut":
            assert r["predicted_iou"] is None and r["stability"] is None
            assert mask_iou(r["mask"], truth) > 0.95  # OpenCV's, whatever the segmenter
        else:
            assert 0.0 <= r["predicted_iou"] <= 1.0 and 0.0 <= r["stability"] <= 1.0
    assert model.encoder_forwards == 1  # three prompts, one image, one encoder forward


@pytest.mark.parametrize("gap", [0, 1, 2])
def test_a_box_near_the_images_right_or_bottom_edge_is_probed_without_reading_past_it(gap):
    """A box whose right and bottom sides lie within PROBE_PX of the image's edge: no colour is read
    past the edge (an IndexError before, which cost the subject its refinements)."""
    img = np.full((128, 382, 3), 200, np.uint8)
    mask = np.zeros((128, 382), bool)
    box = [310.0, 48.0, 382.0 - gap, 128.0 - gap]
    mask[48 : 128 - gap, 310 : 382 - gap] = True
    sides = cut_sides(img, mask, box)
    assert sides["right"] is False and sides["bottom"] is False  # no room past them to compare
    assert sides["left"] and sides["top"]  # the same grey carries on past these
    grown = grown_box(img, mask, box)
    assert grown[2] <= 382 and grown[3] <= 128
