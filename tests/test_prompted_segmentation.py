"""Box-plus-points prompts (SPEC §13: a reviewer's ``REFINE`` and the live preview) in both backends.

Classical: GrabCut seeded by the box and the clicks, on composites made here whose true masks
are known, so the assertions are about the clicks doing what a reviewer means. SAM: a
random-weight tiny model, so the assertions are about plumbing (prompts in the model's
frame, shapes, scores, one encoder forward per image), never mask quality."""

from __future__ import annotations

import time

import cv2
import numpy as np
import pytest
import torch
from segment_anything import SamPredictor
from segment_anything.utils.amg import calculate_stability_score

from hitl_review.deployments.backends import sam as S
from hitl_review.deployments.backends.base import PromptedSegmenter
from hitl_review.deployments.backends.classical import ClassicalSegmenter

H, W = 240, 320


def _noisy(img: np.ndarray, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(img + rng.normal(0, 3, img.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def bottle() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A blue body with a red cap on top, touching: one box holds both."""
    img = np.full((H, W, 3), 235.0)
    body = np.zeros((H, W), bool)
    body[90:200, 110:210] = True
    cap = np.zeros((H, W), bool)
    cap[50:90, 135:185] = True
    img[body], img[cap] = (40, 90, 170), (200, 40, 40)
    return _noisy(img), body, cap


@pytest.fixture(scope="module")
def pair() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A big red object and a smaller blue one, side by side."""
    img = np.full((H, W, 3), 235.0)
    big = np.zeros((H, W), bool)
    big[60:200, 40:150] = True
    small = np.zeros((H, W), bool)
    small[100:170, 190:260] = True
    img[big], img[small] = (200, 40, 40), (40, 90, 170)
    return _noisy(img, 1), big, small


def pt(x: float, y: float, positive: bool = True) -> dict:
    return {"x": x, "y": y, "positive": positive}


@pytest.fixture(scope="module")
def classical() -> ClassicalSegmenter:
    return ClassicalSegmenter()


def test_both_backends_are_prompted_segmenters(classical, sam_seg):
    assert isinstance(classical, PromptedSegmenter) and isinstance(sam_seg, PromptedSegmenter)


def test_classical_positive_point_picks_the_object_it_lands_on(classical, pair):
    img, big, small = pair
    box = [30, 50, 270, 210]  # holds both objects
    plain = classical.segment_prompt(img, "p", box, [])[0]["mask"]
    assert plain[big].mean() > 0.95 and not plain[small].any()  # one subject per box: the biggest
    clicked = classical.segment_prompt(img, "p", box, [pt(225, 135)])[0]
    m = clicked["mask"]
    assert m.shape == (H, W) and m.dtype == bool
    assert m[small].mean() > 0.95 and not m[big].any()
    assert clicked["predicted_iou"] is None and clicked["stability"] is None  # GrabCut has no calibrated score


def test_classical_negative_point_excludes_a_region(classical, bottle):
    img, body, cap = bottle
    box = [105, 45, 215, 205]
    plain = classical.segment_prompt(img, "b", box, [])[0]["mask"]
    assert plain[body].mean() > 0.95 and plain[cap].mean() > 0.95
    m = classical.segment_prompt(img, "b", box, [pt(160, 70, False)])[0]["mask"]
    assert m[body].mean() > 0.95
    assert m[cap].mean() < 0.05  # the whole cap, not only a disc around the click
    assert not m[~(body | cap)].any()


def test_classical_positive_point_past_the_box_extends_the_mask(classical, pair):
    img, big, _ = pair
    box = [40, 60, 120, 200]  # cuts the big object at x = 120 (it runs to 150)
    inside = classical.segment_prompt(img, "p", box, [])[0]["mask"]
    assert not inside[:, 120:].any()  # clipped to the box
    m = classical.segment_prompt(img, "p", box, [pt(140, 130)])[0]["mask"]
    assert m[big].mean() > 0.95 and not m[~big].any()


def test_classical_negative_point_keeps_a_hole_open(classical):
    """A ring: the clean-up fills small holes, unless a negative click marks one."""
    img = np.full((H, W, 3), 235.0)
    ring = np.zeros((H, W), np.uint8)
    cv2.circle(ring, (160, 120), 80, 1, -1)
    cv2.circle(ring, (160, 120), 20, 0, -1)
    img[ring > 0] = (60, 140, 60)
    img = _noisy(img, 2)
    hole = np.zeros((H, W), np.uint8)
    cv2.circle(hole, (160, 120), 16, 1, -1)
    box = [75, 35, 245, 205]
    filled = classical.segment_prompt(img, "r", box, [])[0]["mask"]
    assert filled[hole > 0].all()  # a hole under 10% of the mask counts as a missed highlight
    opened = classical.segment_prompt(img, "r", box, [pt(160, 120, False)])[0]["mask"]
    assert not opened[hole > 0].any() and opened[ring > 0].mean() > 0.95


def test_classical_multimask_returns_several_seedings(classical, bottle):
    img, body, cap = bottle
    out = classical.segment_prompt(img, "b", [105, 45, 215, 205], [pt(160, 140)], multimask=True)
    assert len(out) == 3
    assert [c["method"] for c in out] == ["grabcut-evidence", "grabcut-rect", "grabcut-wide-discs"]
    for c in out:
        assert c["mask"].shape == (H, W) and c["mask"].dtype == bool
        assert c["mask"][150, 160]  # every seeding keeps the positive click
    assert len(classical.segment_prompt(img, "b", [105, 45, 215, 205], [pt(160, 140)])) == 1


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([pt(-1, 10)], r"point 0 \(-1, 10\) lies outside the 320x240 image"),
        ([pt(10, 10), pt(10, 241, False)], r"point 1 \(10, 241\) lies outside the 320x240 image"),
        ([pt(float("nan"), 10)], "point 0: x and y must be finite"),
        ([{"x": 10, "y": 10}], r'point 0 must be \{"x", "y", "positive"\}'),
        ([{"x": 10, "y": 10, "positive": "yes"}], "point 0: positive must be true or false"),
        ([{"x": "left", "y": 10, "positive": True}], "point 0: x and y must be numbers"),
    ],
)
def test_bad_points_are_refused_clearly(classical, sam_seg, bottle, points, message):
    img = bottle[0]
    for seg in (classical, sam_seg):
        with pytest.raises(ValueError, match=message):
            seg.segment_prompt(img, "b", [105, 45, 215, 205], points)


def test_bad_box_is_refused(classical, sam_seg, bottle):
    for seg in (classical, sam_seg):
        with pytest.raises(ValueError, match="outside the 320x240 image"):
            seg.segment_prompt(bottle[0], "b", [105, 45, 400, 205], [pt(10, 10)])


def test_points_on_the_far_edge_are_on_the_image(classical, bottle):
    out = classical.segment_prompt(bottle[0], "b", [105, 45, 215, 205], [pt(W, H, False), pt(0, 0, False)])
    assert out[0]["mask"].shape == (H, W)


# --------------------------------------------------------------------------- SAM (random weights)


@pytest.fixture(scope="module")
def sam_seg() -> S.SamSegmenter:
    torch.manual_seed(0)
    model = S.SamModel(S.build_sam_vit_tiny(), "vit_tiny", "test-fingerprint", device="cpu")
    return S.SamSegmenter(encoder=S.SamEncoder(model))


class PromptSpy:
    """The keyword inputs of the prompt encoder's last forward, while in the ``with`` block."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.last: dict = {}
        self.calls = 0

    def __enter__(self) -> PromptSpy:
        self.handle = self.module.register_forward_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()

    def _hook(self, module, args, kwargs, output):
        self.calls += 1
        self.last = kwargs


def test_sam_points_and_box_reach_the_model_together(sam_seg, bottle):
    img = bottle[0]
    with PromptSpy(sam_seg.encoder.model.sam.prompt_encoder) as spy:
        out = sam_seg.segment_prompt(img, "sam-b", [105, 45, 215, 205], [pt(160, 140), pt(160, 70, False)])
    assert spy.calls == 1
    coords, labels = spy.last["points"]
    s = 1024 / 320  # 320 x 240 -> 1024 x 768
    np.testing.assert_allclose(coords.cpu().numpy(), [[[160 * s, 140 * s], [160 * s, 70 * s]]], rtol=1e-5)
    assert labels.cpu().tolist() == [[1, 0]]
    np.testing.assert_allclose(spy.last["boxes"].cpu().numpy(), [[105 * s, 45 * s, 215 * s, 205 * s]], rtol=1e-5)
    assert len(out) == 1


def test_sam_candidates_shapes_scores_and_order(sam_seg, bottle):
    img = bottle[0]
    box = [105, 45, 215, 205]
    out = sam_seg.segment_prompt(img, "sam-b", box, [pt(160, 140)], multimask=True)
    assert len(out) == 3
    for c in out:
        assert c["mask"].shape == (H, W) and c["mask"].dtype == bool
        assert isinstance(c["predicted_iou"], float) and 0.0 <= c["predicted_iou"] <= 1.0
        assert isinstance(c["stability"], float) and 0.0 <= c["stability"] <= 1.0
        outside = c["mask"].copy()
        outside[45:205, 105:215] = False
        assert not outside.any()  # clipped to the box (no positive click past it)
    ious = [c["predicted_iou"] for c in out]
    assert ious == sorted(ious, reverse=True)
    # Only the box: the prompt carries no points.
    with PromptSpy(sam_seg.encoder.model.sam.prompt_encoder) as spy:
        sam_seg.segment_prompt(img, "sam-b", box, [])
    assert spy.last["points"] is None


def test_sam_stability_is_the_iou_of_offset_thresholds(sam_seg, bottle):
    """The score as ``SamAutomaticMaskGenerator`` computes it, checked on the model's own logits."""
    model = sam_seg.encoder.model
    emb = sam_seg.encoder.embed(bottle[0], "sam-b")
    box = np.array([105, 45, 215, 205], np.float32)
    # Scale the decoder's output so the logits straddle the +/-1 offset (random weights give tiny ones).
    handle = model.sam.mask_decoder.register_forward_hook(lambda mod, args, out: (out[0] * 50.0, out[1]))
    try:
        masks, _, stability = model.predict_prompt(emb, box, np.zeros((0, 2)), np.zeros(0), multimask=True)
        p = SamPredictor(model.sam)
        p.features, p.original_size, p.input_size, p.is_image_set = (
            emb.features,
            emb.original_size,
            emb.input_size,
            True,
        )
        with torch.inference_mode():
            bt = p.transform.apply_boxes_torch(torch.as_tensor(box[None]), emb.original_size)
            logits, _, _ = p.predict_torch(None, None, boxes=bt, multimask_output=True, return_logits=True)
            expected = calculate_stability_score(logits[0], model.sam.mask_threshold, 1.0).numpy()
    finally:
        handle.remove()
    np.testing.assert_allclose(stability, expected, rtol=1e-5)
    assert 0.0 < float(stability.max()) <= 1.0 and masks.shape == (3, H, W)


def test_sam_two_prompts_on_one_image_encode_it_once(sam_seg, bottle):
    img, enc = bottle[0], sam_seg.encoder
    forwards, misses, hits = enc.encoder_forwards, enc.misses, enc.memory_hits
    sam_seg.segment_prompt(img, "once", [105, 45, 215, 205], [pt(160, 140)])
    t = time.perf_counter()
    sam_seg.segment_prompt(img, "once", [105, 45, 215, 205], [pt(160, 140), pt(160, 70, False)], multimask=True)
    second_ms = (time.perf_counter() - t) * 1000
    assert enc.encoder_forwards - forwards == 1 and enc.misses - misses == 1 and enc.memory_hits - hits == 1
    assert second_ms < 2000  # the decoder only; generous for a loaded CI machine
