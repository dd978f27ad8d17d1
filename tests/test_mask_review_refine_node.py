"""A mask review's REFINE on the model side (docs/protocol.md § Cut-out quality): the segmentation
node given a reviewer's points for a box segments it from the box and the points through the
segmenter's prompted path (the classical backend: GrabCut seeded by the points), records the gate's
verdict for the reviewer's information without refining it again, and a segmenter without a
prompted path fails that subject alone with a reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hitl_review.deployments.backends.classical import ClassicalSegmenter
from hitl_review.deployments.executor import Models, process_boxes
from hitl_review.deployments.quality.metrics import mask_iou
from hitl_review.deployments.quality.subject import QualityGate
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.nodes import NodeBox, ProcessInput

from .test_quality_gate_node import mask_of
from .test_refine import scene


@pytest.fixture
def artifacts(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path / 'artifacts'}")


def refine(models: Models, image: np.ndarray, boxes: dict[str, list[float]], prompts: dict[str, Any], artifacts):
    ref = ImageRef(sha256="f" * 64, width=image.shape[1], height=image.shape[0], url="file:///unused.png")
    inp = ProcessInput(
        image=ref,
        approved_box_list=[NodeBox(box_id=k, bbox=v, label="thing") for k, v in boxes.items()],
        prompts=prompts,
    )
    return [s.model_dump(mode="json") for s in process_boxes(inp, models, artifacts, image).subjects]


def test_points_and_box_make_the_mask_and_the_gate_only_records(artifacts) -> None:
    image, truth, (x1, y1, x2, y2) = scene("ellipse")
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    points = {"box_1": [{"x": cx, "y": cy, "positive": True}, {"x": x1 + 2, "y": y1 + 2, "positive": False}]}
    models = Models(segmenter=ClassicalSegmenter(), quality=QualityGate(max_refinements=3))
    [out] = refine(models, image, {"box_1": [x1, y1, x2, y2]}, points, artifacts)
    assert out["status"] == "SUCCEEDED", out
    assert out["refinements"] == []  # the reviewer decided: no refinement loop
    assert out["quality"] is not None and out["quality"]["policy"] == "gate-v1"
    mask = mask_of(artifacts, out["mask"])
    assert mask_iou(mask, truth) > 0.8
    assert not mask[int(y1) + 2, int(x1) + 2]  # the negative click is outside


def test_a_segmenter_without_a_prompted_path_fails_that_subject_with_a_reason(artifacts) -> None:
    class BoxOnly:
        name = "box-only"

        def segment(self, image, sha, boxes):  # pragma: no cover - never called on a REFINE
            raise AssertionError("a REFINE must not fall back to the box-only path")

    image, _truth, bbox = scene("rectangle")
    [out] = refine(Models(segmenter=BoxOnly()), image, {"box_1": list(bbox)}, {"box_1": [{"x": 5, "y": 5}]}, artifacts)
    assert out["status"] == "FAILED" and "no prompted path" in out["reason"]
