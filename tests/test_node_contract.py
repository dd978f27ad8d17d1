"""The node contract of ``statecore.nodes`` and the backend registry of ``deployments.backends.base``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hitl_review.deployments.backends.base import BACKEND_MODULES, backend_class, make_segmenter, register
from hitl_review.deployments.executor import Models, run_node
from hitl_review.statecore.errors import NodeExecutionError
from hitl_review.statecore.models import Box, ImageRef
from hitl_review.statecore.nodes import (
    CONTROL_PLANE_NODES,
    MODEL_NODES,
    NodeBox,
    ProcessInput,
    parse_input,
    parse_output,
)
from hitl_review.statecore.states import NodeType

IMAGE = ImageRef(sha256="a" * 64, width=64, height=48, url="/api/v1/artifacts/img_x.png")


def test_every_node_type_is_either_run_by_a_model_or_the_control_plane_or_unsupported():
    assert MODEL_NODES == {
        NodeType.DETECT_SUBJECTS,
        NodeType.VALIDATE_MANUAL_BOX_LIST,
        NodeType.PROCESS_APPROVED_BOX_LIST,
        NodeType.SEGMENT_SUBJECT,  # one subject per node (statecore.subjects)
    }
    assert CONTROL_PLANE_NODES == {NodeType.FINALIZE_RESULTS}
    # the gate and the refinements run inside SEGMENT_SUBJECT on the Segmenter (deployments.quality)
    for t in (NodeType.QUALITY_GATE_SUBJECT, NodeType.REFINE_SUBJECT, "WAIT_FOR_USER"):
        with pytest.raises(NodeExecutionError) as e:
            parse_output(t, {})
        assert e.value.code == "UNSUPPORTED_NODE_TYPE" and not e.value.retryable
    assert NodeType.DETECT_SUBJECTS == "DETECT_SUBJECTS"  # a str enum: the wire format is the name


def test_a_box_travels_to_a_node_unchanged():
    box = Box(box_id="box_1", bbox=(1, 2, 30, 40), label="shoe", score=0.5, source="model")
    inp = ProcessInput(image=IMAGE, approved_box_list=[NodeBox.of(box)])
    assert inp.model_dump(mode="json")["approved_box_list"] == [box.model_dump(mode="json")]
    # A hand-written input needs only what an executor reads.
    minimal = parse_input(
        "PROCESS_APPROVED_BOX_LIST",
        {"image": IMAGE.model_dump(), "approved_box_list": [{"box_id": "b", "bbox": [1, 2, 3, 4]}]},
    )
    assert isinstance(minimal, ProcessInput) and minimal.approved_box_list[0].bbox == (1.0, 2.0, 3.0, 4.0)


def test_outputs_accept_numpy_scalars_and_refuse_wrong_types():
    ok = parse_output(
        "VALIDATE_MANUAL_BOX_LIST",
        {"results": [{"box_id": "b", "passed": np.bool_(True), "score": np.float32(0.75), "reason": None}]},
    )
    assert ok.results[0].passed is True and ok.results[0].score == 0.75
    for bad in (
        {"results": [{"box_id": "b", "passed": "yes"}]},
        {"results": [{"box_id": "b", "passed": True, "score": "0.7"}]},
        {"results": [{"box_id": 7, "passed": True}]},
        {"results": None},
        {},
    ):
        with pytest.raises(NodeExecutionError) as e:
            parse_output("VALIDATE_MANUAL_BOX_LIST", bad)
        assert (
            e.value.code == "INVALID_NODE_OUTPUT"
            and not e.value.retryable
            and "VALIDATE_MANUAL_BOX_LIST" in str(e.value)
        )
    with pytest.raises(NodeExecutionError):
        parse_output("DETECT_SUBJECTS", {"boxes": [{"bbox": [0, 0, float("nan"), 4]}]})


class JunkDetector:
    name = "junk"

    def detect(self, image, image_sha):
        return [{"label": "shoe", "score": 0.9}]  # no bbox


def test_a_backend_answer_outside_the_contract_is_not_retried(tmp_path):
    import io

    from PIL import Image

    from hitl_review.statecore.artifacts import ArtifactStore

    store = ArtifactStore(f"file://{tmp_path}/artifacts")
    buf = io.BytesIO()
    Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(buf, "PNG")
    ref = {**IMAGE.model_dump(), "url": store.url(store.put("img", buf.getvalue(), "png"))}
    with pytest.raises(NodeExecutionError) as e:
        run_node("DETECT_SUBJECTS", {"image": ref}, Models(detector=JunkDetector()), store)
    assert e.value.code == "INVALID_NODE_OUTPUT" and e.value.retryable is False


def test_registry_names_and_errors():
    assert backend_class("segmenter", "classical").__name__ == "ClassicalSegmenter"
    with pytest.raises(ValueError, match="unknown segmenter backend 'nope'"):
        make_segmenter("nope")
    assert set(BACKEND_MODULES["detector"]) == {"classical", "sam", "sam-auto", "torchvision", "null"}
    assert set(BACKEND_MODULES["validator"]) == {"classical", "sam", "sam-auto", "torchvision", "null"}

    @register("segmenter", "test-null")
    class Null:
        name = "null"

        def segment(self, image, image_sha, boxes):
            return []

    assert isinstance(make_segmenter("test-null"), Null)


def test_the_classical_default_never_imports_torch():
    code = (
        "import sys; from hitl_review.deployments.executor import build_models; build_models({}); "
        "assert 'torch' not in sys.modules and 'segment_anything' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
