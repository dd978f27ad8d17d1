"""``deployments/backends/grabcut_steps.py``: a box's neighbourhood at a work size and back, and a seeded
GrabCut that repeats whatever drew from OpenCV's RNG before it (the classical backend's masks and
boxes, on photographs scikit-image ships)."""

from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
from skimage import data as skdata

from hitl_review.deployments.backends.background import resize_max
from hitl_review.deployments.backends.classical import ClassicalDetector, ClassicalSegmenter
from hitl_review.deployments.backends.grabcut_steps import BoxCrop, crop_around, grown, run_grabcut


def unrelated_grabcut(seed: int = 1) -> None:
    """A GrabCut on random noise: it draws from this thread's OpenCV RNG, as any other cut would."""
    noise = np.random.default_rng(seed).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    gc = np.zeros((60, 80), np.uint8)
    bgd, fgd = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
    cv2.grabCut(noise, gc, (5, 5, 60, 40), bgd, fgd, 1, cv2.GC_INIT_WITH_RECT)


# --------------------------------------------------------------------------- reproducible cuts


def test_the_classical_segmenter_gives_the_same_mask_whatever_ran_before():
    # Unseeded, the second cut of the coffee cup differed from the first by ~1000 pixels.
    image, seg = skdata.coffee(), ClassicalSegmenter()
    boxes = [{"box_id": "cup", "bbox": [100, 50, 500, 380]}, {"box_id": "spoon", "bbox": [380, 200, 600, 400]}]
    first = seg.segment(image, "sha", boxes)
    unrelated_grabcut()
    again = seg.segment(image, "sha", boxes)
    assert [r["method"] for r in first] == [r["method"] for r in again]
    for a, b in zip(first, again, strict=True):
        assert a["mask"].any()
        assert np.array_equal(a["mask"], b["mask"]), (a["box_id"], int((a["mask"] != b["mask"]).sum()))


def test_prompted_cuts_repeat_whatever_ran_before():
    image, seg = skdata.astronaut(), ClassicalSegmenter()
    bbox, points = [100, 20, 450, 512], [{"x": 260.0, "y": 120.0, "positive": True}]
    first = seg.segment_prompt(image, "sha", bbox, points, multimask=True)
    unrelated_grabcut(2)
    again = seg.segment_prompt(image, "sha", bbox, points, multimask=True)
    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a["mask"], b["mask"]), a["method"]


def test_scene_proposals_repeat_whatever_ran_before():
    image, det = skdata.astronaut(), ClassicalDetector()
    assert det.foreground(image)[2] > det.clutter_threshold  # a scene: GrabCut proposes the boxes
    first = det.detect(image, "sha")
    unrelated_grabcut(3)
    assert first and det.detect(image, "sha") == first


# --------------------------------------------------------------------------- BoxCrop


def _inline(image, bounds, margin_frac, work_px):
    """The steps as each caller spelled them out before ``crop_around``."""
    oh, ow = image.shape[:2]
    x1, y1, x2, y2 = bounds
    m = max(4, round(margin_frac * max(x2 - x1, y2 - y1)))
    rx1, ry1, rx2, ry2 = max(0, x1 - m), max(0, y1 - m), min(ow, x2 + m), min(oh, y2 + m)
    crop, s = resize_max(image[ry1:ry2, rx1:rx2], work_px)
    ch, cw = crop.shape[:2]
    bx1, by1 = round((x1 - rx1) * s), round((y1 - ry1) * s)
    bx2, by2 = min(cw, max(bx1 + 1, round((x2 - rx1) * s))), min(ch, max(by1 + 1, round((y2 - ry1) * s)))
    return (rx1, ry1, rx2, ry2), crop, s, (bx1, by1, bx2, by2)


def _box_mask(shape, box):
    x1, y1, x2, y2 = box
    out = np.zeros(shape, bool)
    out[y1:y2, x1:x2] = True
    return out


def _there_and_back(near: BoxCrop) -> np.ndarray:
    return near.paste(_box_mask(near.crop.shape[:2], near.box))


def test_a_box_on_the_images_edge_maps_there_and_back_exactly():
    image = np.random.default_rng(0).integers(0, 256, (100, 150, 3), dtype=np.uint8)
    near = crop_around(image, (0, 20, 60, 100), margin_frac=0.1, work_px=320)
    assert near.rect == (0, 12, 68, 100)  # an 8 px margin, clipped on the left and at the bottom
    assert near.s == 1.0 and near.crop.shape == (88, 68, 3) and near.box == (0, 8, 60, 88)
    assert np.array_equal(near.crop, image[12:100, 0:68])
    assert np.array_equal(_there_and_back(near), _box_mask((100, 150), (0, 20, 60, 100)))
    assert near.to_work_xy(10.0, 20.0) == (10, 8)


def test_a_box_larger_than_the_work_size_is_shrunk_and_comes_back_close():
    h, w = 900, 1200
    image = np.random.default_rng(1).integers(0, 256, (h, w, 3), dtype=np.uint8)
    box = (100, 50, 1100, 850)
    near = crop_around(image, box, margin_frac=0.1, work_px=320)
    assert near.rect == (0, 0, 1200, 900)  # 100 px of margin, clipped to the image
    assert near.s == pytest.approx(320 / 1200) and near.crop.shape == (240, 320, 3)
    assert near.box == (27, 13, 293, 227)
    back = _there_and_back(near)
    truth = _box_mask((h, w), box)
    assert back.shape == (h, w)
    assert np.count_nonzero(back & truth) / np.count_nonzero(back | truth) > 0.99
    ys, xs = np.nonzero(back)
    step = int(np.ceil(1 / near.s))  # one work pixel, in image pixels
    assert abs(xs.min() - 100) <= step and abs(xs.max() + 1 - 1100) <= step
    assert abs(ys.min() - 50) <= step and abs(ys.max() + 1 - 850) <= step
    small = near.to_work(truth)  # the image's mask at the work size: the box again
    assert small[near.box[1] + 1 : near.box[3] - 1, near.box[0] + 1 : near.box[2] - 1].all()
    assert not small[:, : near.box[0] - 1].any() and not small[: near.box[1] - 1].any()


@pytest.mark.parametrize(
    ("shape", "box", "work_px", "rect", "box_in_crop"),
    [
        ((3, 2), (0, 0, 2, 3), 320, (0, 0, 2, 3), (0, 0, 2, 3)),  # the whole tiny image
        ((3, 2), (1, 1, 1, 1), 320, (0, 0, 2, 3), (1, 1, 2, 2)),  # an empty box still gets one pixel
        ((1, 1), (0, 0, 1, 1), 320, (0, 0, 1, 1), (0, 0, 1, 1)),
        ((10, 7), (2, 3, 5, 8), 4, (0, 0, 7, 10), (1, 1, 2, 3)),  # shrunk to 4 px: s = 0.4
    ],
)
def test_a_tiny_image(shape, box, work_px, rect, box_in_crop):
    image = np.random.default_rng(2).integers(0, 256, (*shape, 3), dtype=np.uint8)
    near = crop_around(image, box, margin_frac=0.1, work_px=work_px)
    assert near.rect == rect and near.box == box_in_crop
    bx1, by1, bx2, by2 = near.box
    ch, cw = near.crop.shape[:2]
    assert 0 <= bx1 < bx2 <= cw and 0 <= by1 < by2 <= ch
    back = _there_and_back(near)
    assert back.shape == shape and back.any()
    if near.s == 1.0:
        x1, y1, x2, y2 = box
        assert np.array_equal(back, _box_mask(shape, (x1, y1, max(x2, x1 + 1), max(y2, y1 + 1))))


def test_crop_around_is_what_every_caller_computed_inline():
    rng = np.random.default_rng(3)
    for _ in range(300):
        h, w = (int(v) for v in rng.integers(1, 900, size=2))
        image = np.zeros((h, w, 3), np.uint8)
        x1, y1 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x2, y2 = int(rng.integers(x1 + 1, w + 1)), int(rng.integers(y1 + 1, h + 1))
        frac, work_px = float(rng.choice([0.1, 0.15])), int(rng.choice([32, 64, 320]))
        near = crop_around(image, (x1, y1, x2, y2), margin_frac=frac, work_px=work_px)
        rect, crop, s, box = _inline(image, (x1, y1, x2, y2), frac, work_px)
        assert (near.rect, near.crop.shape, near.s, near.box) == (rect, crop.shape, s, box)


def test_grown_truncates_and_clips():
    assert grown((10, 20, 110, 70), 0.03, 200, 100) == (7, 18, 113, 71)
    assert grown((0, 0, 200, 100), 0.03, 200, 100) == (0, 0, 200, 100)


# --------------------------------------------------------------------------- run_grabcut


@pytest.mark.parametrize(
    ("gc", "rect"),
    [
        (np.full((20, 30), cv2.GC_BGD, np.uint8), None),  # background only: nothing to learn a subject from
        (np.full((20, 30), cv2.GC_PR_FGD, np.uint8), None),  # foreground only
        (np.full((10, 30), cv2.GC_PR_FGD, np.uint8), None),  # not the picture's size
        (np.zeros((20, 30), np.uint8), (0, 0, 0, 0)),  # an empty rectangle
    ],
)
def test_run_grabcut_answers_none_where_opencv_refuses(gc, rect, caplog):
    rgb = np.random.default_rng(4).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    with caplog.at_level(logging.DEBUG, logger="hitl_review.deployments.backends.grabcut_steps"):
        assert run_grabcut(rgb, gc, 2, rect=rect) is None
    assert "grabcut refused" in caplog.text


def test_run_grabcut_repeats_and_the_seed_is_the_callers():
    rgb = skdata.coffee()[::4, ::4]
    h, w = rgb.shape[:2]
    seeds = np.full((h, w), cv2.GC_BGD, np.uint8)
    seeds[h // 8 : 7 * h // 8, w // 8 : 7 * w // 8] = cv2.GC_PR_FGD
    first = run_grabcut(rgb, seeds.copy(), 2)
    unrelated_grabcut()
    assert first is not None and first.dtype == bool and first.shape == (h, w)
    assert np.array_equal(run_grabcut(rgb, seeds.copy(), 2), first)
    assert np.array_equal(run_grabcut(rgb, seeds.copy(), 2, seed=5), run_grabcut(rgb, seeds.copy(), 2, seed=5))
