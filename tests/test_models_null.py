"""The zero-cost backends (``hitl up --detector null --segmenter null``, issue 37): answers of the
contract's shape from the image's size alone, named ``null`` wherever the backends are named, and
the delay flags still honoured. No Ray: the factories and the Serve builder's bound arguments."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hitl_review.deployments.backends.base import (
    DelayedDetector,
    DelayedSegmenter,
    DetectorBackend,
    PromptedSegmenter,
    SegmenterBackend,
    ValidatorBackend,
    make_detector,
    make_segmenter,
    make_validator,
)
from hitl_review.deployments.executor import build_models
from hitl_review.deployments.serve import build_model_deployments
from hitl_review.serve_app.cli import build_parser
from hitl_review.serve_app.ops import preflight
from hitl_review.serve_app.ops.launcher import settings_from_args


@pytest.mark.parametrize("shape", [(480, 640, 3), (37, 23, 3), (2, 2, 3)])
def test_null_detector_boxes_lie_inside_the_image(shape):
    image = np.zeros(shape, np.uint8)
    det = make_detector("null")
    assert isinstance(det, DetectorBackend) and det.name == "null"
    found = det.detect(image, "sha")
    assert len(found) == 2 and [d["score"] for d in found] == sorted((d["score"] for d in found), reverse=True)
    h, w = shape[:2]
    for d in found:
        x1, y1, x2, y2 = d["bbox"]
        assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h
        assert d["label"] == "object" and 0.0 <= d["score"] <= 1.0
    assert found == det.detect(image, "other")  # fixed: the size alone decides
    assert len(make_detector("null", boxes=1, label="thing").detect(image, "sha")) == 1


def test_null_validator_passes_every_box_on_the_image():
    image = np.zeros((100, 200, 3), np.uint8)
    val = make_validator("null")
    assert isinstance(val, ValidatorBackend) and val.name == "null" and val.policy_version
    boxes = [
        {"box_id": "a", "bbox": [0, 0, 200, 100], "label": "x"},
        {"box_id": "b", "bbox": [10, 10, 20, 30], "label": "y"},
        {"box_id": "off", "bbox": [150, 10, 260, 50], "label": "z"},
    ]
    out = val.validate(image, "sha", boxes)
    assert [r["box_id"] for r in out] == ["a", "b", "off"]
    assert out[0] == {"box_id": "a", "passed": True, "score": 1.0, "reason": None}
    assert out[1]["passed"] is True
    assert out[2]["passed"] is False and "outside" in out[2]["reason"]


def test_null_segmenter_mask_is_the_box():
    image = np.zeros((60, 80, 3), np.uint8)
    seg = make_segmenter("null")
    assert isinstance(seg, SegmenterBackend) and isinstance(seg, PromptedSegmenter) and seg.name == "null"
    out = seg.segment(image, "sha", [{"box_id": "b1", "bbox": [10.5, 5, 30, 40]}, {"box_id": "bad", "bbox": [1, 2]}])
    mask = out[0]["mask"]
    assert out[0]["box_id"] == "b1" and mask.shape == (60, 80) and mask.dtype == bool
    assert mask.sum() == (30 - 10) * (40 - 5) and mask[5:40, 10:30].all()
    assert out[1]["box_id"] == "bad" and not out[1]["mask"].any() and out[1]["reason"]

    (cand,) = seg.segment_prompt(image, "sha", [10, 10, 20, 20], [{"x": 40, "y": 15, "positive": True}])
    assert cand["mask"].shape == (60, 80) and cand["mask"][10:20, 10:41].all() and cand["mask"].sum() == 10 * 31
    with pytest.raises(ValueError):
        seg.segment_prompt(image, "sha", [10, 10, 20, 20], [{"x": 400, "y": 15, "positive": True}])


def test_null_from_the_command_line_to_the_backends(tmp_path):
    argv = ["up", "--data-dir", str(tmp_path), "--detector", "null", "--segmenter", "null"]
    settings = settings_from_args(build_parser().parse_args([*argv, "--detector-delay-ms", "120"]))
    assert settings.backends() == {"detector": "null", "validator": "null", "segmenter": "null"}
    preflight.check_models(settings)  # no file, no torch needed
    cfg = settings.backend_config()
    bound = {k: v._bound_deployment.init_args[:2] for k, v in build_model_deployments(cfg).items()}
    assert bound == {
        "Detector": ("null", {"delay_ms": 120}),
        "BoxValidator": ("null", {}),
        "Segmenter": ("null", {}),
    }
    models = build_models(cfg)
    assert isinstance(models.detector, DelayedDetector)
    assert {k: models.describe()[k] for k in ("detector", "validator", "segmenter")} == dict.fromkeys(
        ("detector", "validator", "segmenter"), "null"
    )
    t0 = time.perf_counter()
    assert len(models.detector.detect(np.zeros((10, 10, 3), np.uint8), "sha")) == 2
    assert time.perf_counter() - t0 >= 0.12

    settings = settings_from_args(build_parser().parse_args([*argv, "--segmenter-delay-ms", "5"]))
    assert isinstance(build_models(settings.backend_config(), ("segmenter",)).segmenter, DelayedSegmenter)
    chosen = settings_from_args(build_parser().parse_args([*argv, "--validator", "classical"]))
    assert chosen.validator_backend == "classical"
