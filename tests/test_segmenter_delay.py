"""``--segmenter-delay-ms`` reaches the Segmenter deployment's backend the way ``--detector-delay-ms``
reaches the detector's: from the command line through ``Settings.backend_config()`` to a real
classical GrabCut segmenter that takes that much longer per call (no Ray needed)."""

from __future__ import annotations

import time

import numpy as np

from hitl_review.deployments.backends.base import DelayedSegmenter
from hitl_review.deployments.executor import build_models
from hitl_review.deployments.serve import build_model_deployments
from hitl_review.serve_app.cli import build_parser
from hitl_review.serve_app.ops.launcher import settings_from_args


def test_segmenter_delay_from_the_command_line_to_the_backend(tmp_path):
    args = build_parser().parse_args(["up", "--data-dir", str(tmp_path), "--segmenter-delay-ms", "150"])
    settings = settings_from_args(args)
    assert settings.segmenter_delay_ms == 150
    cfg = settings.backend_config()
    seg = build_model_deployments(cfg)["Segmenter"]._bound_deployment
    assert seg.init_args[:2] == ("classical", {"delay_ms": 150})
    assert "delay_ms" not in build_model_deployments(cfg)["BoxValidator"]._bound_deployment.init_args[1]

    models = build_models(cfg, ("segmenter", "validator"))
    assert isinstance(models.segmenter, DelayedSegmenter) and models.segmenter.name == "classical"
    image = np.full((64, 64, 3), 240, np.uint8)
    image[16:48, 16:48] = (200, 30, 30)
    t0 = time.perf_counter()
    out = models.segmenter.segment(image, "sha", [{"box_id": "b1", "bbox": [14, 14, 50, 50]}])
    assert time.perf_counter() - t0 >= 0.15
    assert out[0]["box_id"] == "b1" and out[0]["mask"].shape == (64, 64)


def test_no_segmenter_delay_by_default(tmp_path):
    settings = settings_from_args(build_parser().parse_args(["up", "--data-dir", str(tmp_path)]))
    assert "delay_ms" not in settings.backend_config()["segmenter"]
    assert not isinstance(build_models(settings.backend_config(), ("segmenter",)).segmenter, DelayedSegmenter)
