"""The weight-free OpenCV backends on composites made here and on photographs scikit-image ships.

Composites: a red "shoe" (ellipse, with a soft cast shadow) and a blue "box" (textured
rectangle) on a light studio background with a vertical light fall-off and sensor noise.
The assertions are about working on such pictures (boxes found, empty background
refused, masks close to the truth), not about state-of-the-art quality."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data as skdata

from hitl_review.deployments.backends.base import box_iou, make_detector, make_segmenter, make_validator, mask_bbox
from hitl_review.deployments.backends.classical import ClassicalDetector, ClassicalSegmenter, ClassicalValidator
from hitl_review.statecore.nodes import Detection


def composite(h: int = 480, w: int = 640, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    img = np.empty((h, w, 3), np.float32)
    img[:] = (236, 236, 232)
    img += np.linspace(-8, 8, h)[:, None, None]  # studio light fall-off
    shoe = np.zeros((h, w), np.uint8)
    cv2.ellipse(shoe, (190, 300), (120, 60), -10, 0, 360, 1, -1)
    box = np.zeros((h, w), np.uint8)
    cv2.rectangle(box, (400, 120), (560, 360), 1, -1)
    shadow = cv2.GaussianBlur(np.roll(shoe, 12, axis=0).astype(np.float32), (41, 41), 0)
    img *= (1 - 0.15 * shadow)[..., None]
    img[shoe > 0] = (170, 40, 40)
    img[box > 0] = (40, 90, 170)
    img[box > 0] += rng.normal(0, 6, (int(box.sum()), 3))
    img += rng.normal(0, 3, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), {"shoe": shoe.astype(bool), "box": box.astype(bool)}


@pytest.fixture(scope="module")
def scene():
    return composite()


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum()) / float((a | b).sum())


def test_detector_finds_each_object(scene):
    img, truth = scene
    dets = ClassicalDetector().detect(img, "sha")
    assert 1 <= len(dets) <= 10
    for d in dets:
        x1, y1, x2, y2 = d["bbox"]
        assert 0 <= x1 < x2 <= img.shape[1] and 0 <= y1 < y2 <= img.shape[0]
        assert d["label"] == "object" and 0.0 <= d["score"] <= 1.0
    for name, m in truth.items():
        best = max(box_iou(d["bbox"], mask_bbox(m)) for d in dets)
        assert best > 0.5, f"no box around the {name} (best IoU {best:.2f})"
    assert [d["score"] for d in dets] == sorted((d["score"] for d in dets), reverse=True)


def test_detector_on_empty_background_and_cap():
    rng = np.random.default_rng(1)
    plain = np.clip(rng.normal(230, 3, (300, 400, 3)), 0, 255).astype(np.uint8)
    assert ClassicalDetector().detect(plain, "sha") == []
    img = np.full((300, 400, 3), 235, np.uint8)
    for i in range(6):  # six separate dark squares, capped at three
        cv2.rectangle(img, (20 + 60 * i, 100), (60 + 60 * i, 140), (30, 30, 30), -1)
    assert len(ClassicalDetector(max_detections=3).detect(img, "sha")) == 3


def test_validator_passes_objects_and_fails_background(scene):
    img, truth = scene
    v = ClassicalValidator(threshold=0.5)
    boxes = [
        {"box_id": "shoe", "bbox": mask_bbox(truth["shoe"]), "label": "shoe"},
        {"box_id": "box_loose", "bbox": [380, 100, 580, 380], "label": None},
        {"box_id": "empty", "bbox": [10, 10, 120, 110], "label": None},
        {"box_id": "empty_between", "bbox": [250, 20, 390, 200], "label": None},
        {"box_id": "half_box", "bbox": [480, 100, 600, 380], "label": None},
        {"box_id": "outside", "bbox": [600, 400, 700, 500], "label": None},
    ]
    res = {r["box_id"]: r for r in v.validate(img, "sha", boxes)}
    assert [r["box_id"] for r in v.validate(img, "sha", boxes)] == [b["box_id"] for b in boxes]
    assert res["shoe"]["passed"] and res["shoe"]["reason"] is None
    assert res["box_loose"]["passed"]
    for bad in ("empty", "empty_between", "half_box", "outside"):
        assert not res[bad]["passed"], bad
        assert isinstance(res[bad]["reason"], str) and res[bad]["reason"]
    assert "background" in res["empty"]["reason"]
    assert "cuts" in res["half_box"]["reason"]
    for r in res.values():
        assert 0.0 <= r["score"] <= 1.0
        assert r["passed"] == (r["score"] >= v.threshold)
    assert v.policy_version and v.name == "classical"


def test_validator_threshold_is_configurable(scene):
    img, truth = scene
    box = [{"box_id": "a", "bbox": [10, 10, 120, 110], "label": None}]
    assert ClassicalValidator(threshold=0.0).validate(img, "sha", box)[0]["passed"]
    with pytest.raises(ValueError):
        ClassicalValidator(threshold=1.5)


def test_grabcut_masks_follow_the_objects(scene):
    img, truth = scene
    seg = ClassicalSegmenter()
    boxes = [{"box_id": "shoe", "bbox": [60, 225, 320, 372]}, {"box_id": "box", "bbox": [390, 110, 570, 370]}]
    out = seg.segment(img, "sha", boxes)
    assert [r["box_id"] for r in out] == ["shoe", "box"]
    for r, b in zip(out, boxes, strict=True):
        m = r["mask"]
        assert m.dtype == bool and m.shape == img.shape[:2]
        x1, y1, x2, y2 = (int(v) for v in b["bbox"])
        assert not m[:y1].any() and not m[y2:].any() and not m[:, :x1].any() and not m[:, x2:].any()
        assert mask_iou(m, truth[r["box_id"]]) > 0.8
        assert cv2.connectedComponents(m.astype(np.uint8))[0] == 2  # one component (plus background)


def test_segmenter_fallback_and_feather(scene):
    img, _ = scene
    seg = ClassicalSegmenter(feather_px=3)
    out = seg.segment(
        img,
        "sha",
        [
            {"box_id": "empty", "bbox": [10, 10, 120, 110]},
            {"box_id": "box", "bbox": [390, 110, 570, 370]},
            {"box_id": "bad", "bbox": [5, 5, 5, 50]},
        ],
    )
    empty, box, bad = out
    assert not empty["mask"].any() and empty["reason"]
    assert bad["reason"] and not bad["mask"].any()
    alpha = box["alpha"]
    assert alpha.dtype == np.uint8 and alpha.shape == img.shape[:2]
    assert set(np.unique(alpha[~box["mask"]])) == {0}
    assert 0 < (alpha[box["mask"]] < 255).mean() < 0.5  # a soft rim, an opaque core


@pytest.mark.parametrize("photo", ["astronaut", "coffee", "chelsea"])
def test_real_photographs_end_to_end(photo):
    img = getattr(skdata, photo)()
    det, val, seg = make_detector(), make_validator(), make_segmenter()
    boxes = det.detect(img, photo)
    for d in boxes:
        assert set(d) == {"bbox", "label", "score", "evidence"} and 0 <= d["score"] <= 1
    h, w = img.shape[:2]
    probes = [{"box_id": f"b{i}", "bbox": d["bbox"], "label": d["label"]} for i, d in enumerate(boxes[:2])]
    probes.append({"box_id": "centre", "bbox": [w * 0.25, h * 0.25, w * 0.75, h * 0.75], "label": None})
    verdicts = val.validate(img, photo, probes)
    assert [v["box_id"] for v in verdicts] == [p["box_id"] for p in probes]
    for v in verdicts:
        assert isinstance(v["passed"], bool) and 0 <= v["score"] <= 1
        assert (v["reason"] is None) == v["passed"]
    masks = seg.segment(img, photo, probes)
    assert [m["box_id"] for m in masks] == [p["box_id"] for p in probes]
    for m in masks:
        assert m["mask"].shape == (h, w) and m["mask"].dtype == bool
    assert masks[-1]["mask"].any()


def test_factory_names():
    assert make_detector("classical").name == "classical"
    assert make_detector(None).name == "classical"
    with pytest.raises(ValueError, match="unknown detector backend"):
        make_detector("yolo")
    with pytest.raises(ValueError, match="unknown segmenter backend"):
        make_segmenter("torchvision")


def test_detector_evidence_sees_a_shadow_taken_in_and_two_subjects_merged():
    """``ClassicalDetector.evidence`` (the box policy's image features, benchmarks/box_evidence.py): a box
    stretched over its subject's drop shadow would shrink more than the tight one, and a box around two
    separate subjects holds two parts."""
    h, w = 300, 400
    img = np.full((h, w, 3), 235.0, np.float32)
    subject = np.zeros((h, w), np.float32)
    subject[80:180, 100:200] = 1
    shadow = cv2.GaussianBlur(np.roll(subject, (14, 16), (0, 1)), (0, 0), 5)
    img *= (1 - 0.35 * shadow)[..., None]
    img[80:180, 100:200] = (150, 40, 30)
    img[60:120, 280:360] = (30, 60, 150)
    img = np.clip(img + np.random.default_rng(0).normal(0, 2, img.shape), 0, 255).astype(np.uint8)
    det = ClassicalDetector()
    tight, over_shadow, both = [100, 80, 200, 180], [100, 80, 222, 200], [95, 55, 365, 185]
    ev = det.evidence(img, [tight, over_shadow, both])
    assert ev[0]["parts"] == ev[1]["parts"] == 1 and ev[2]["parts"] == 2, ev
    assert ev[0]["shrink"] < 0.1 and ev[1]["shrink"] > ev[0]["shrink"] + 0.15, ev
    # What the Detector deployment reports: each detected box with the evidence of that box.
    found = det.detect(img, "sha")
    assert found and [b["evidence"] for b in found] == det.evidence(img, [b["bbox"] for b in found])
    assert all(Detection.model_validate(b).evidence is not None for b in found)
