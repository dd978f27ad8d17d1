"""The torchvision detector backend: a random-weight Faster R-CNN written to a local file and
loaded back through the backend's own loader (nothing downloaded). The classifier's bias
is set so that every proposal reads as "person" with a known confidence, which makes the
label names and the score threshold checkable without trained weights."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models import get_model

from hitl_review.deployments.backends.base import ModelLoadError, make_detector, make_validator
from hitl_review.deployments.backends.tv_detector import TorchvisionDetector, coco_categories
from hitl_review.deployments.executor import Models, run_node
from hitl_review.statecore.artifacts import ArtifactStore

ARCH = "fasterrcnn_mobilenet_v3_large_320_fpn"
PERSON = 1
BIAS = 8.0  # softmax over 91 classes: exp(8) / (exp(8) + 90) ~ 0.97 for "person"
PERSON_SCORE = math.exp(BIAS) / (math.exp(BIAS) + 90)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    torch.manual_seed(0)
    model = get_model(ARCH, weights=None, weights_backbone=None)
    with torch.no_grad():
        cls = model.roi_heads.box_predictor.cls_score
        cls.weight.zero_()
        cls.bias.zero_()
        cls.bias[PERSON] = BIAS
    path = tmp_path_factory.mktemp("tv") / "frcnn.pth"
    torch.save(model.state_dict(), path)
    return str(path)


@pytest.fixture(scope="module")
def image():
    rng = np.random.default_rng(0)
    img = np.full((240, 360, 3), 200, np.uint8)
    img[40:200, 60:160] = rng.integers(0, 255, (160, 100, 3), dtype=np.uint8)
    return img


def test_categories_come_from_torchvision_metadata():
    cats = coco_categories(ARCH)
    assert len(cats) == 91 and cats[0] == "__background__" and cats[PERSON] == "person"


@pytest.fixture(scope="module")
def detector(weights):
    return make_detector("torchvision", weights=weights, arch=ARCH, score_threshold=0.5, max_detections=7, device="cpu")


def test_loads_and_detects(detector, image):
    assert detector.name == f"torchvision-{ARCH}"
    boxes = detector.detect(image, "sha")
    assert 1 <= len(boxes) <= 7
    for b in boxes:
        assert set(b) == {"bbox", "label", "score"}
        assert b["label"] == "person"
        assert b["score"] == pytest.approx(PERSON_SCORE, abs=1e-3)
        x1, y1, x2, y2 = b["bbox"]
        assert 0 <= x1 < x2 <= 360 and 0 <= y1 < y2 <= 240
    assert [b["score"] for b in boxes] == sorted((b["score"] for b in boxes), reverse=True)


def test_score_threshold_and_label_filter(weights, detector, image, monkeypatch):
    above = TorchvisionDetector(weights, ARCH, score_threshold=PERSON_SCORE + 0.01, device="cpu")
    assert above.detect(image, "sha") == []
    monkeypatch.setattr(detector, "include_labels", {"cup"})
    assert detector.detect(image, "sha") == []
    with pytest.raises(ValueError):
        TorchvisionDetector(weights, ARCH, score_threshold=1.5)


def test_wrong_or_missing_file_is_a_clear_error(weights, tmp_path):
    with pytest.raises(ModelLoadError, match="do not exist"):
        TorchvisionDetector(tmp_path / "nope.pth", ARCH)
    with pytest.raises(ModelLoadError, match="needs a local weights file"):
        TorchvisionDetector(None, ARCH)
    other = tmp_path / "classifier.pth"
    torch.save(get_model("mobilenet_v3_small", weights=None).state_dict(), other)
    with pytest.raises(ModelLoadError, match=f"do not match architecture '{ARCH}'"):
        TorchvisionDetector(other, ARCH)
    with pytest.raises(ModelLoadError, match="do not match architecture 'fasterrcnn_mobilenet_v3_large_fpn'"):
        TorchvisionDetector(weights, "fasterrcnn_mobilenet_v3_large_fpn", labels=["bg", "thing"])
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match="cannot read"):
        TorchvisionDetector(garbage, ARCH)
    with pytest.raises(ModelLoadError, match="unknown torchvision detection architecture"):
        TorchvisionDetector(weights, "yolov8")


# --------------------------------------------------------------------------- naming manual boxes


def test_classify_boxes_names_each_box_by_the_box_heads_classifier(detector, image, monkeypatch):
    """The box is the region proposal: its pooled features go through the box head's classifier. The
    biased random classifier makes "person" the answer at a known softmax probability."""
    boxes = [{"box_id": "patch", "bbox": [60, 40, 160, 200]}, {"box_id": "off", "bbox": [300, 10, 400, 50]}]
    named = detector.classify_boxes(image, boxes)
    assert [n["box_id"] for n in named] == ["patch", "off"]
    assert named[0]["label"] == "person" and named[0]["score"] == pytest.approx(PERSON_SCORE, abs=1e-3)
    assert named[1] == {"box_id": "off", "label": None, "score": 0.0}  # outside the image: nothing to name
    # Only allowed names: with include_labels the best allowed class and its (here tiny) probability.
    monkeypatch.setattr(detector, "include_labels", {"cup"})
    (cup,) = detector.classify_boxes(image, boxes[:1])
    assert cup["label"] == "cup" and cup["score"] == pytest.approx(1 / (math.exp(BIAS) + 90), abs=1e-3)


def test_torchvision_validator_names_unlabelled_boxes_through_the_validator_node(weights, image, tmp_path):
    """``--validator torchvision``: the classical geometry, and the detector's classifier names a box sent
    without a label; below ``naming_threshold`` the box goes back to the reviewer: "name this box"."""
    store = ArtifactStore(f"file://{tmp_path}/artifacts")
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "PNG")
    ref = {"sha256": "s" * 64, "width": 360, "height": 240, "url": store.url(store.put("img", buf.getvalue(), "png"))}
    box = {"box_id": "box_a", "bbox": [50, 30, 170, 210], "label": None, "source": "manual"}
    inp = {"image": ref, "round": 1, "items_to_validate": [box]}

    validator = make_validator("torchvision", weights=weights, arch=ARCH, device="cpu")
    assert validator.name == f"torchvision-{ARCH}" and validator.naming_threshold == 0.5
    (v,) = run_node("VALIDATE_MANUAL_BOX_LIST", inp, Models(validator=validator), store)["results"]
    assert v["passed"] is True and v["label"] == "person" and v["label_source"] == validator.name
    assert v["label_score"] == pytest.approx(PERSON_SCORE, abs=1e-3)

    validator.naming_threshold = 0.99  # the --config option naming_threshold
    (v,) = run_node("VALIDATE_MANUAL_BOX_LIST", inp, Models(validator=validator), store)["results"]
    assert v["passed"] is False and v["label"] is None
    assert v["reason"].startswith(f"name this box: the {validator.name} validator's best guess, 'person', is 0.97 sure")
