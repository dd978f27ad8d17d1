"""``deployments.executor.run_node`` with the classical backends and a real ArtifactStore on disk,
in the shapes ``statecore.decide`` sends and reads; plus the Serve wrappers' wiring,
without starting Ray."""

from __future__ import annotations

import asyncio
import hashlib
import io
import time

import cv2
import numpy as np
import pytest
from PIL import Image

from hitl_review.deployments.backends.base import DelayedDetector, make_detector
from hitl_review.deployments.executor import Models, build_models, load_image, run_node
from hitl_review.serve_app.ops.config import Settings
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.errors import NodeExecutionError


def product_photo() -> np.ndarray:
    rng = np.random.default_rng(3)
    img = np.clip(rng.normal(238, 3, (300, 420, 3)), 0, 255).astype(np.uint8)
    cv2.ellipse(img, (120, 160), (80, 50), 15, 0, 360, (180, 30, 40), -1)
    cv2.rectangle(img, (260, 60), (380, 250), (30, 80, 160), -1)
    return img


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(f"file://{tmp_path}/artifacts")


@pytest.fixture
def image_ref(store):
    img = product_photo()
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    data = buf.getvalue()
    name = store.put("img", data, "png")
    return {"sha256": hashlib.sha256(data).hexdigest(), "width": 420, "height": 300, "url": store.url(name)}


@pytest.fixture(scope="module")
def models():
    return Models(
        detector=make_detector("classical"),
        validator=build_models({}, ("validator",)).validator,
        segmenter=build_models({}, ("segmenter",)).segmenter,
    )


def box(box_id, bbox, source="manual"):
    """A Box as the control plane dumps it into node input."""
    return {
        "box_id": box_id,
        "bbox": bbox,
        "label": None,
        "score": None,
        "source": source,
        "target_policy": "SEGMENT",
        "validation": None,
    }


def test_load_image(store, image_ref):
    img = load_image(store, image_ref["url"])
    assert img.shape == (300, 420, 3) and img.dtype == np.uint8
    with pytest.raises(NodeExecutionError) as e:
        load_image(store, "img_" + "0" * 32 + ".png")
    assert e.value.code == "ARTIFACT_NOT_FOUND" and e.value.retryable is False


def test_detect_subjects(models, store, image_ref):
    out = run_node("DETECT_SUBJECTS", {"image": image_ref}, models, store)
    assert out["backend"] == "classical"
    assert len(out["boxes"]) == 2
    for b in out["boxes"]:
        assert set(b) == {"bbox", "label", "score", "evidence"} and len(b["bbox"]) == 4
        assert set(b["evidence"]) == {"shrink", "parts"}  # what the box policy reads (statecore.models)
        assert all(isinstance(v, float) for v in b["bbox"]) and 0.0 <= b["score"] <= 1.0


def test_validate_manual_boxes(models, store, image_ref):
    items = [box("box_obj", [30, 90, 210, 230]), box("box_empty", [10, 260, 200, 295])]
    out = run_node(
        "VALIDATE_MANUAL_BOX_LIST",
        {"image": image_ref, "round": 1, "items_to_validate": items, "box_list": items, "reusable_valid_items": []},
        models,
        store,
    )
    assert out["backend"] == "classical" and out["threshold"] == 0.5 and out["policy_version"]
    res = {r["box_id"]: r for r in out["results"]}
    assert set(res["box_obj"]) == {"box_id", "passed", "score", "reason", "label", "label_score", "label_source"}
    assert res["box_obj"]["passed"] is True and res["box_obj"]["reason"] is None
    # Sent without a label: named by the classical backend (its one name), with its confidence and source.
    assert res["box_obj"]["label"] == "object" and res["box_obj"]["label_source"] == "classical"
    assert 0.5 <= res["box_obj"]["label_score"] <= 1.0
    assert res["box_empty"]["passed"] is False and res["box_empty"]["label"] is None
    assert res["box_empty"]["reason"].startswith("name this box: ")
    empty = run_node("VALIDATE_MANUAL_BOX_LIST", {"image": image_ref, "items_to_validate": []}, models, store)
    assert empty["results"] == []


def test_validate_names_only_unlabelled_boxes_and_only_in_round_one(models, store, image_ref):
    labelled = {**box("box_shoe", [30, 90, 210, 230]), "label": "shoe"}
    unlabelled = box("box_obj", [30, 90, 210, 230])
    inp = {"image": image_ref, "round": 1, "items_to_validate": [labelled, unlabelled]}
    res = {r["box_id"]: r for r in run_node("VALIDATE_MANUAL_BOX_LIST", inp, models, store)["results"]}
    assert res["box_shoe"]["passed"] is True and res["box_shoe"]["label"] is None  # the reviewer's label stands
    assert res["box_obj"]["passed"] is True and res["box_obj"]["label"] == "object"
    # A validator that is never sure enough sends the box back, saying what it guessed.
    strict = Models(
        validator=build_models(
            {
                "validator": {"name": "classical"},
                "deployments": {"BoxValidator": {"options": {"naming_threshold": 1.0}}},
            },
            ("validator",),
        ).validator
    )
    res = run_node(
        "VALIDATE_MANUAL_BOX_LIST", {**inp, "items_to_validate": [box("box_loose", [0, 0, 240, 300])]}, strict, store
    )["results"]
    assert res[0]["passed"] is False and res[0]["label"] is None
    assert res[0]["reason"].startswith("name this box: the classical validator's best guess, 'object', is 0.")
    # Round 2: the reviewer names boxes; one still unlabelled fails with the reason, whatever its geometry.
    res = run_node("VALIDATE_MANUAL_BOX_LIST", {**inp, "round": 2}, models, store)["results"]
    by_id = {r["box_id"]: r for r in res}
    assert by_id["box_shoe"]["passed"] is True
    assert by_id["box_obj"]["passed"] is False and by_id["box_obj"]["label"] is None
    assert by_id["box_obj"]["reason"] == "name this box: round 2 takes the reviewer's label"


def test_process_approved_boxes_writes_masks_and_cutouts(models, store, image_ref):
    approved = [
        box("box_a", [30, 90, 210, 230], "model"),
        box("box_b", [250, 50, 390, 260], "model"),
        box("box_empty", [10, 262, 120, 298], "model"),
    ]
    out = run_node("PROCESS_APPROVED_BOX_LIST", {"image": image_ref, "approved_box_list": approved}, models, store)
    subjects = {s["box_id"]: s for s in out["subjects"]}
    assert list(subjects) == ["box_a", "box_b", "box_empty"]
    for bid in ("box_a", "box_b"):
        s = subjects[bid]
        assert s["status"] == "SUCCEEDED" and s["reason"] is None
        mask = Image.open(io.BytesIO(store.get(s["mask"])))
        cut = Image.open(io.BytesIO(store.get(s["cutout"])))
        assert mask.mode == "L" and mask.size == (420, 300)
        assert cut.mode == "RGBA" and cut.size == (420, 300)
        m = np.asarray(mask)
        assert set(np.unique(m)) == {0, 255}
        np.testing.assert_array_equal(np.asarray(cut)[..., 3], m)  # alpha is the mask
        assert s["mask"].startswith("mask_") and s["cutout"].startswith("cutout_")
    a = np.asarray(Image.open(io.BytesIO(store.get(subjects["box_a"]["mask"])))) > 0
    assert a[160, 120] and not a[:, 215:].any()  # the ellipse, nothing of the box beside it
    failed = subjects["box_empty"]
    assert failed["status"] == "FAILED" and failed["reason"] and failed["mask"] is None


def test_unsupported_and_bad_input(models, store, image_ref):
    for node_type in ("WAIT_FOR_USER", "FINALIZE_RESULTS", "QUALITY_GATE_SUBJECT"):
        with pytest.raises(NodeExecutionError) as e:
            run_node(node_type, {"image": image_ref}, models, store)
        assert e.value.code == "UNSUPPORTED_NODE_TYPE" and e.value.retryable is False
    with pytest.raises(NodeExecutionError) as e:
        run_node("DETECT_SUBJECTS", {}, models, store)
    assert e.value.code == "INVALID_NODE_INPUT" and not e.value.retryable
    with pytest.raises(NodeExecutionError) as e:
        run_node(
            "PROCESS_APPROVED_BOX_LIST", {"image": image_ref, "approved_box_list": [{"bbox": [1, 2]}]}, models, store
        )
    assert e.value.code == "INVALID_NODE_INPUT"
    with pytest.raises(NodeExecutionError) as e:
        run_node("DETECT_SUBJECTS", {"image": image_ref}, Models(), store)
    assert e.value.code == "BACKEND_NOT_CONFIGURED" and not e.value.retryable


def test_build_models_from_settings_and_detector_delay(store, image_ref):
    cfg = Settings(detector_delay_ms=60).backend_config()
    built = build_models(cfg, artifacts=store)
    assert isinstance(built.detector, DelayedDetector) and built.detector.name == "classical"
    assert built.describe() == {
        "detector": "classical",
        "validator": "classical",
        "validator_threshold": 0.5,
        "validator_policy": built.validator.policy_version,
        "segmenter": "classical",
        "quality_gate": {"policy": "gate-v1", "max_refinements": 2},
    }
    t0 = time.perf_counter()
    run_node("DETECT_SUBJECTS", {"image": image_ref}, built, store)
    assert time.perf_counter() - t0 >= 0.06
    # Per-deployment backend options from the --config file reach the backend.
    cfg["deployments"] = {"BoxValidator": {"options": {"threshold": 0.8}}}
    assert build_models(cfg, ("validator",)).validator.threshold == 0.8


def test_serve_wrappers_without_ray(store, image_ref):
    from hitl_review.deployments.serve import Detector, build_model_deployments, deployment_options

    cfg = Settings(detector_delay_ms=5).backend_config()
    cfg["artifacts"] = store.root
    cfg["deployments"] = {
        "Segmenter": {
            "max_replicas": 4,
            "target_ongoing_requests": 3,
            "max_batch_size": 8,
            "options": {"feather_px": 2},
        },
        "detector": {"num_replicas": 2},
    }
    apps = build_model_deployments(cfg)
    assert set(apps) == {"Detector", "BoxValidator", "Segmenter"}
    seg = apps["Segmenter"]._bound_deployment
    assert seg._deployment_config.autoscaling_config.max_replicas == 4
    assert seg._deployment_config.autoscaling_config.target_ongoing_requests == 3
    # Then one model thread per request slot (max_ongoing_requests), and the quality gate (the
    # Segmenter's alone: it runs where the masks are made).
    gate = {"policy": "gate-v1", "max_refinements": 2}
    assert seg.init_args == ("classical", {"feather_px": 2}, store.root, {"max_batch_size": 8}, 16, gate)
    assert seg.max_ongoing_requests == 16
    det = apps["Detector"]._bound_deployment
    assert det.num_replicas == 2 and det._deployment_config.autoscaling_config is None
    assert det.init_args[:2] == ("classical", {"delay_ms": 5}) and det.init_args[-1] is None
    for app in apps.values():  # classical backends never ask for a GPU
        assert "num_gpus" not in app._bound_deployment.ray_actor_options
    assert deployment_options("sam", {"num_gpus": 0.5}, gpu=True)["ray_actor_options"]["num_gpus"] == 0.5
    assert "num_gpus" not in deployment_options("sam", {"num_gpus": 0.5}, gpu=False)["ray_actor_options"]

    replica = Detector.func_or_class("classical", {}, store.root, {})
    assert replica.describe()["detector"] == "classical"
    out = asyncio.run(replica.run("DETECT_SUBJECTS", {"image": image_ref}))
    assert out["backend"] == "classical" and len(out["boxes"]) == 2
