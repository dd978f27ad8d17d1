"""The quality gate inside the segmentation node (docs/protocol.md § Cut-out quality): every mask the
classical segmenter makes is gated under the deployment's policy; a failing one is refined and gated
again; what the node reports carries the verdict and the refinements; a refinement that breaks costs
only itself; the gate's settings are refused before ``hitl up`` starts anything."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from hitl_review.deployments.backends.classical import ClassicalSegmenter
from hitl_review.deployments.executor import Models, build_models, process_boxes
from hitl_review.deployments.quality.metrics import mask_iou
from hitl_review.deployments.quality.refine import STRATEGIES
from hitl_review.deployments.quality.subject import QualityGate
from hitl_review.serve_app.ops.config import Settings
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.nodes import NodeBox, ProcessInput

from .test_cli_errors import one_line, up
from .test_refine import scene


@pytest.fixture
def artifacts(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(f"file://{tmp_path / 'artifacts'}")


def run(models: Models, artifacts: ArtifactStore, image: np.ndarray, bbox: list[float]) -> dict[str, Any]:
    ref = ImageRef(sha256="e" * 64, width=image.shape[1], height=image.shape[0], url="file:///unused.png")
    inp = ProcessInput(image=ref, approved_box_list=[NodeBox(box_id="box_1", bbox=bbox, label="thing")])
    [subject] = process_boxes(inp, models, artifacts, image).subjects
    return subject.model_dump(mode="json")


def mask_of(artifacts: ArtifactStore, name: str) -> np.ndarray:
    with Image.open(io.BytesIO(artifacts.get(name))) as im:
        return np.asarray(im.convert("L")) > 0


@pytest.mark.parametrize("shape", ["ellipse", "rectangle"])
def test_a_mask_cut_by_a_short_box_fails_is_refined_and_the_better_mask_is_kept(artifacts, shape):
    image, truth, (x1, y1, x2, y2) = scene(shape)
    short = [x1, y1, x2 - 0.15 * (x2 - x1), y2]  # the box 15% short on the right: the mask is cut off
    plain = run(Models(segmenter=ClassicalSegmenter()), artifacts, image, short)
    assert plain["quality"] is None and plain["refinements"] == []  # no gate: as before
    before = mask_iou(mask_of(artifacts, plain["mask"]), truth)

    gated = run(Models(segmenter=ClassicalSegmenter(), quality=QualityGate()), artifacts, image, short)
    assert gated["status"] == "SUCCEEDED"
    assert gated["refinements"], "the cut-off mask passed the gate"
    assert gated["refinements"][0]["strategy"] == STRATEGIES[0] == "enlarged_box"
    assert all(r["quality"]["policy"] == "gate-v1" for r in gated["refinements"])
    kept = mask_of(artifacts, gated["mask"])
    after = mask_iou(kept, truth)
    assert after > before + 0.05 and after > 0.95, (before, after)
    assert gated["quality"]["verdict"] == "PASS", gated["quality"]
    assert gated["quality"] == gated["refinements"][-1]["quality"]  # the verdict is the kept mask's
    # The cut-out is the kept mask's: its alpha covers exactly the mask.
    with Image.open(io.BytesIO(artifacts.get(gated["cutout"]))) as im:
        assert np.array_equal(np.asarray(im)[..., 3] > 0, kept)


def test_a_mask_still_failing_after_its_refinements_keeps_the_least_broken_one(artifacts):
    """A quarter short: one enlargement does not reach the subject's end; the mask kept is the
    enlarged one (better than the first, still cut: FAIL), and the next strategy started from it."""
    image, truth, (x1, y1, x2, y2) = scene("ellipse")
    short = [x1, y1, x2 - 0.25 * (x2 - x1), y2]
    out = run(Models(segmenter=ClassicalSegmenter(), quality=QualityGate()), artifacts, image, short)
    assert [r["strategy"] for r in out["refinements"]] == ["enlarged_box", "alt_multimask"]
    assert out["quality"]["verdict"] == "FAIL" and out["quality"]["reasons"]
    first = run(Models(segmenter=ClassicalSegmenter()), artifacts, image, short)
    before, after = (mask_iou(mask_of(artifacts, o["mask"]), truth) for o in (first, out))
    assert after > before + 0.1, (before, after)


def test_a_good_mask_passes_at_once_and_zero_refinements_keeps_a_failing_one(artifacts):
    image, truth, (x1, y1, x2, y2) = scene("rectangle")
    drawn = [x1 - 4, y1 - 4, x2 + 4, y2 + 4]  # a box as a reviewer draws it, a little loose
    good = run(Models(segmenter=ClassicalSegmenter(), quality=QualityGate()), artifacts, image, drawn)
    assert good["quality"]["verdict"] == "PASS" and good["refinements"] == [], good["quality"]
    assert mask_iou(mask_of(artifacts, good["mask"]), truth) > 0.9
    short = [x1, y1, x2 - 0.3 * (x2 - x1), y2]
    kept = run(Models(segmenter=ClassicalSegmenter(), quality=QualityGate(max_refinements=0)), artifacts, image, short)
    assert kept["status"] == "SUCCEEDED" and kept["refinements"] == []
    assert kept["quality"]["verdict"] == "FAIL" and kept["quality"]["reasons"], kept["quality"]


class Broken(ClassicalSegmenter):
    """A segmenter whose prompted calls fail (a refinement strategy that breaks)."""

    def segment_prompt(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        raise RuntimeError("decoder exploded")


def test_a_refinement_that_breaks_costs_only_itself(artifacts, caplog):
    image, _, (x1, y1, x2, y2) = scene("ellipse", seed=1)
    short = [x1, y1, x2 - 0.25 * (x2 - x1), y2]
    out = run(Models(segmenter=Broken(), quality=QualityGate()), artifacts, image, short)
    assert out["status"] == "SUCCEEDED" and out["mask"] and out["refinements"] == []
    assert out["quality"]["verdict"] == "FAIL"
    assert "refinement 1 (enlarged_box) failed" in caplog.text


def test_the_gate_settings_travel_from_settings_to_the_segmenters_models():
    models = build_models(Settings(quality_gate_policy="gate-v1", max_refinements=3).backend_config(), ("segmenter",))
    assert models.quality == QualityGate("gate-v1", 3)
    assert models.describe()["quality_gate"] == {"policy": "gate-v1", "max_refinements": 3}
    assert build_models(Settings().backend_config(), ("detector",)).quality is None
    assert QualityGate.from_config({"enabled": False}) is None


@pytest.mark.parametrize(
    ("policy", "n", "words"),
    [("gate-v9", 2, ("unknown quality-gate policy 'gate-v9'", "gate-v1")), ("gate-v1", 9, ("0..4", "enlarged_box"))],
)
def test_a_bad_gate_setting_is_refused(policy, n, words):
    with pytest.raises(ValueError) as e:
        QualityGate(policy, n)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_hitl_up_refuses_an_unknown_policy_in_one_line_before_starting(tmp_path: Path):
    proc = up(tmp_path, "--quality-gate-policy", "gate-v9")
    one_line(proc, 2, "--quality-gate-policy", "gate-v9", "gate-v1")
    assert not (tmp_path / "data" / "deployment.json").exists()
