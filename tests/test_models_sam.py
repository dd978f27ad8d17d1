"""Segment Anything plumbing on a random-weight SAM small enough for a CPU.

The checkpoint is written here and read back through the production loader
(``load_sam`` -> ``SAM_BUILDERS`` -> strict ``load_state_dict``), so the vit_b/l/h path is
the one under test; only the architecture is narrower. Assertions are about shapes,
coordinates, batching and caching, never mask quality (the weights are random)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import re

import numpy as np
import pytest
import torch
from PIL import Image

from hitl_review.deployments.backends import sam as S
from hitl_review.deployments.backends.base import ModelLoadError, make_detector, make_segmenter, make_validator
from hitl_review.statecore.artifacts import ArtifactStore

SHA = "ab" * 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("sam") / "sam_tiny.pth"
    torch.save(S.build_sam_vit_tiny().state_dict(), path)
    return str(path)


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(f"file://{tmp_path}/artifacts")


@pytest.fixture
def image():
    """Non-square on purpose: 240 x 400, so prompts and masks must be scaled per axis."""
    img = np.full((240, 400, 3), 230, np.uint8)
    img[60:180, 50:170] = (200, 30, 30)
    img[100:220, 250:380] = (30, 60, 190)
    return img


@pytest.fixture(autouse=True)
def _fresh_shared_models():
    S.clear_shared()
    yield
    S.clear_shared()


class Counter:
    """Counts forwards of a module, and keeps the keyword inputs of the last one."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self.last_kwargs: dict = {}
        self.handle = module.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        self.calls += 1
        self.last_kwargs = kwargs


def test_loader_builds_the_registry_architecture(checkpoint):
    model = S.SamModel.from_checkpoint(checkpoint, "vit_tiny", device="cpu")
    assert model.model_type == "vit_tiny" and model.device.type == "cpu"
    assert model.amp_dtype is None and model.sdpa is False  # bf16 and SDPA are CUDA-only by default
    assert set(S.sam_model_registry) <= set(S.SAM_BUILDERS)  # vit_b/l/h come from segment_anything itself
    assert model.sam.image_encoder.img_size == 1024
    assert "cpu" in model.describe


def test_loader_errors_are_clear(checkpoint, tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        S.load_sam(tmp_path / "missing.pth", "vit_tiny")
    with pytest.raises(ModelLoadError, match="needs a checkpoint"):
        S.load_sam(None, "vit_b")
    with pytest.raises(ModelLoadError, match="unknown SAM model_type"):
        S.load_sam(checkpoint, "vit_xxl")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"<html>404 not found</html>")
    with pytest.raises(ModelLoadError, match="cannot read"):
        S.load_sam(garbage, "vit_tiny")
    state = torch.load(checkpoint, weights_only=True)
    state.pop("mask_decoder.iou_token.weight")
    state["image_encoder.pos_embed"] = torch.zeros(1, 64, 64, 768)  # looks like a ViT-B file
    wrong = tmp_path / "wrong.pth"
    torch.save(state, wrong)
    with pytest.raises(ModelLoadError, match=r"does not match model_type 'vit_tiny'.*vit_b"):
        S.load_sam(wrong, "vit_tiny")


def test_segment_batches_boxes_and_maps_coordinates(checkpoint, store, image):
    seg = make_segmenter("sam", checkpoint=checkpoint, model_type="vit_tiny", device="cpu", artifacts=store)
    model = seg.encoder.model
    decoder, prompts = Counter(model.sam.mask_decoder), Counter(model.sam.prompt_encoder)
    boxes = [
        {"box_id": "a", "bbox": [50, 60, 170, 180]},
        {"box_id": "b", "bbox": [250, 100, 380, 220]},
        {"box_id": "c", "bbox": [0, 0, 400, 240]},
        {"box_id": "bad", "bbox": [390, 10, 420, 30]},
    ]
    out = seg.segment(image, SHA, boxes)
    assert decoder.calls == 1  # every valid box of the image in one decoder call
    assert [r["box_id"] for r in out] == ["a", "b", "c", "bad"]
    # Prompts reach the model in the 1024-long-side frame: 400 x 240 -> 1024 x 614.
    sent = prompts.last_kwargs["boxes"].cpu().numpy()
    scale_x, scale_y = 1024 / 400, 614 / 240
    expected = np.array([b["bbox"] for b in boxes[:3]], np.float32) * [scale_x, scale_y, scale_x, scale_y]
    np.testing.assert_allclose(sent, expected, rtol=1e-5)
    for r, b in zip(out[:3], boxes[:3], strict=True):
        m = r["mask"]
        assert m.shape == (240, 400) and m.dtype == bool
        x1, y1, x2, y2 = (int(v) for v in b["bbox"])
        outside = m.copy()
        outside[y1:y2, x1:x2] = False
        assert not outside.any()  # clipped to its box
        # The decoder's predicted IoU rides along, for the quality gate's scores.
        assert 0.0 <= r["predicted_iou"] <= 1.0
    assert out[3]["reason"] and not out[3]["mask"].any() and "predicted_iou" not in out[3]
    from hitl_review.deployments.quality.subject import QualityGate

    gated = QualityGate(max_refinements=0).check(seg, image, SHA, boxes[0]["bbox"], out[0])
    assert gated.quality["scores"]["predicted_iou"] == pytest.approx(out[0]["predicted_iou"], abs=1e-4)


def test_predict_boxes_returns_image_sized_masks(checkpoint, image):
    model = S.SamModel.from_checkpoint(checkpoint, "vit_tiny", device="cpu")
    enc = S.SamEncoder(model)
    emb = enc.embed(image, SHA)
    assert emb.original_size == (240, 400) and emb.input_size == (614, 1024)
    assert tuple(emb.features.shape[-2:]) == (64, 64)
    masks, iou = model.predict_boxes(emb, np.array([[10, 10, 100, 100]] * 3, np.float32), multimask=True)
    assert masks.shape == (3, 240, 400) and masks.dtype == bool and iou.shape == (3,)


def test_embedding_cache_memory_store_and_second_replica(checkpoint, store, image):
    seg = S.SamSegmenter(checkpoint=checkpoint, model_type="vit_tiny", device="cpu", artifacts=store)
    val = S.SamValidator(checkpoint=checkpoint, model_type="vit_tiny", device="cpu", artifacts=store)
    assert val.encoder is seg.encoder  # one model and one cache per process
    enc = seg.encoder
    forwards = Counter(enc.model.sam.image_encoder)
    box = [{"box_id": "a", "bbox": [50, 60, 170, 180], "label": None}]
    val.validate(image, SHA, box)
    seg.segment(image, SHA, box)
    assert forwards.calls == 1 and enc.encoder_forwards == 1
    assert (enc.misses, enc.memory_hits, enc.store_hits) == (1, 1, 0)
    name = enc.artifact_name(SHA)
    assert re.fullmatch(r"emb_[0-9a-f]{32}\.pt", name) and store.exists(name)

    # Another replica (or a restart): a private encoder on the same store loads, does not encode.
    other = S.get_encoder(checkpoint, "vit_tiny", device="cpu", artifacts=store, share=False)
    assert other is not enc
    other_forwards = Counter(other.model.sam.image_encoder)
    emb = S.SamSegmenter(encoder=other).encoder.embed(image, SHA)
    assert other_forwards.calls == 0 and other.store_hits == 1 and other.misses == 0
    assert emb.original_size == (240, 400)
    torch.testing.assert_close(emb.features, enc.embed(image, SHA).features, atol=2e-2, rtol=1e-2)  # fp16 copy

    # An empty store: a fresh encoder has to encode.
    cold = S.get_encoder(
        checkpoint, "vit_tiny", device="cpu", share=False, artifacts=ArtifactStore(store.root + "-other")
    )
    cold.embed(image, SHA)
    assert cold.misses == 1 and cold.encoder_forwards == 1


def test_embed_batch_is_one_forward_and_matches_single(checkpoint, image):
    enc = S.SamEncoder(S.SamModel.from_checkpoint(checkpoint, "vit_tiny", device="cpu"))
    images = [image, image[:120], image[:, :150]]
    embs = enc.embed_batch(images, ["x", "y", "z"])
    assert enc.encoder_forwards == 1 and enc.misses == 3
    assert [e.original_size for e in embs] == [(240, 400), (120, 400), (240, 150)]
    assert [e.input_size for e in embs] == [(614, 1024), (307, 1024), (1024, 640)]
    alone = S.SamEncoder(enc.model).embed(images[2], "z")
    torch.testing.assert_close(alone.features, embs[2].features, atol=1e-4, rtol=1e-4)
    assert enc.encoder_forwards == 2  # the counter is the model's, shared by both encoders
    again = enc.embed_batch([images[0], images[0]], ["x", "x"])
    assert enc.encoder_forwards == 2 and again[0] is again[1]  # cached: no new forward


def test_validator_scores_and_threshold(checkpoint, image):
    boxes = [
        {"box_id": "a", "bbox": [50, 60, 170, 180], "label": None},
        {"box_id": "b", "bbox": [0, 0, 60, 50], "label": None},
        {"box_id": "bad", "bbox": [10, 10, 10, 40], "label": None},
    ]
    lenient = make_validator("sam", checkpoint=checkpoint, model_type="vit_tiny", device="cpu", threshold=0.0)
    strict = make_validator("sam", checkpoint=checkpoint, model_type="vit_tiny", device="cpu", threshold=1.0)
    assert lenient.policy_version.startswith("sam-vit_tiny") and lenient.name == "sam-vit_tiny"
    for v in (lenient, strict):
        res = v.validate(image, SHA, boxes)
        assert [r["box_id"] for r in res] == ["a", "b", "bad"]
        for r in res[:2]:
            assert 0.0 <= r["score"] <= 1.0
            assert r["passed"] == (r["score"] >= v.threshold)
            assert (r["reason"] is None) == r["passed"]
        assert res[2] == {"box_id": "bad", "passed": False, "score": 0.0, "reason": res[2]["reason"]}
    assert all(r["passed"] for r in lenient.validate(image, SHA, boxes[:2]))
    with pytest.raises(ValueError):
        S.SamValidator(encoder=lenient.encoder, threshold=2.0)


def test_sam_auto_detector_format_and_shared_embedding(checkpoint, image):
    # Random weights propose little: accept every mask, even a frame-filling one.
    det = make_detector(
        "sam-auto",
        checkpoint=checkpoint,
        model_type="vit_tiny",
        device="cpu",
        points_per_side=4,
        pred_iou_thresh=0.0,
        stability_score_thresh=0.0,
        max_detections=5,
        min_area_frac=0.0,
        max_area_frac=1.0,
    )
    forwards = Counter(det.encoder.model.sam.image_encoder)
    boxes = det.detect(image, SHA)
    assert det.name == "sam-auto-vit_tiny"
    assert 1 <= len(boxes) <= 5
    for b in boxes:
        assert set(b) == {"bbox", "label", "score"} and b["label"] == "object"
        x1, y1, x2, y2 = b["bbox"]
        assert 0 <= x1 < x2 <= 400 and 0 <= y1 < y2 <= 240
        assert 0.0 <= b["score"] <= 1.0
    assert [b["score"] for b in boxes] == sorted((b["score"] for b in boxes), reverse=True)
    assert forwards.calls == 1
    # The segmenter of the same process reuses the detector's embedding.
    seg = make_segmenter("sam", checkpoint=checkpoint, model_type="vit_tiny", device="cpu")
    seg.segment(image, SHA, [{"box_id": "a", "bbox": [50, 60, 170, 180]}])
    assert forwards.calls == 1 and seg.encoder.memory_hits >= 1


def test_sam_auto_proposals_to_boxes(checkpoint, image, monkeypatch):
    """The conversion: XYWH with inclusive ends -> xyxy, score = IoU x stability, frame-filling
    and tiny masks dropped, NMS, best first, capped."""
    det = S.SamAutoDetector(
        encoder=S.get_encoder(checkpoint, "vit_tiny", device="cpu"), max_detections=2, nms_iou=0.5, min_area_frac=0.01
    )

    def rec(x, y, w, h, iou, stab):
        return {"bbox": [x, y, w, h], "area": (w + 1) * (h + 1), "predicted_iou": iou, "stability_score": stab}

    records = [
        rec(50, 60, 119, 119, 0.9, 0.9),  # the red square
        rec(52, 61, 117, 118, 0.8, 0.9),  # a near duplicate of it: NMS
        rec(250, 100, 129, 119, 1.2, 0.5),  # IoU head above 1 is clipped
        rec(0, 0, 399, 239, 0.99, 0.99),  # the whole frame: background
        rec(5, 5, 3, 3, 0.99, 0.99),  # a speck
        rec(200, 10, 30, 30, 0.3, 0.5),
    ]  # a real but weak one: beyond the cap
    monkeypatch.setattr(det.generator, "generate", lambda img: records)
    assert det.detect(image, SHA) == [
        {"bbox": [50.0, 60.0, 170.0, 180.0], "label": "object", "score": 0.81},
        {"bbox": [250.0, 100.0, 380.0, 220.0], "label": "object", "score": 0.5},
    ]


def test_sdpa_attention_matches_the_original():
    from segment_anything.modeling import ImageEncoderViT

    torch.manual_seed(0)
    enc = ImageEncoderViT(
        img_size=128,
        patch_size=16,
        embed_dim=32,
        depth=2,
        num_heads=2,
        out_chans=16,
        use_rel_pos=True,
        window_size=4,
        global_attn_indexes=(1,),
    ).eval()
    with torch.no_grad():
        for name, p in enc.named_parameters():
            if "rel_pos" in name:
                p.normal_(0, 0.5)  # zero-initialised by default: make the bias matter
    x = torch.randn(2, 3, 128, 128)
    with torch.inference_mode():
        ref = enc(x)
        assert S.use_sdpa_attention(enc) == 2
        got = enc(x)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


def test_serve_deployment_batches_the_encoder(checkpoint, store, monkeypatch):
    """``@serve.batch`` on the Segmenter: three concurrent requests for three images make one
    encoder forward. Runs the deployment class without a Ray cluster."""
    import ray.serve.batching as batching

    from hitl_review.deployments.serve import Segmenter

    # Outside a replica the queue cannot read the replica's max_ongoing_requests for its warning.
    monkeypatch.setattr(batching._BatchQueue, "_warn_if_max_batch_size_exceeds_max_ongoing_requests", lambda self: None)
    dep = Segmenter.func_or_class(
        "sam",
        {"checkpoint": checkpoint, "model_type": "vit_tiny", "device": "cpu"},
        store.root,
        {"max_batch_size": 4, "batch_wait_timeout_s": 0.5},
    )
    refs = []
    for i in range(3):
        img = np.full((200 + 20 * i, 300, 3), 40 * i, np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "PNG")
        name = store.put("img", buf.getvalue(), "png")
        refs.append(
            {
                "sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
                "width": 300,
                "height": 200 + 20 * i,
                "url": store.url(name),
            }
        )

    async def all_three():
        return await asyncio.gather(
            *[
                dep.run(
                    "PROCESS_APPROVED_BOX_LIST",
                    {"image": r, "approved_box_list": [{"box_id": "b", "bbox": [10, 10, 150, 150]}]},
                )
                for r in refs
            ]
        )

    async def twice():  # one event loop: @serve.batch's queue belongs to the loop it started on
        first = await all_three()
        seen = dep.describe()
        await all_three()  # the same images again: every embedding from the replica's memory
        return first, seen

    outs, info = asyncio.run(twice())
    assert [len(o["subjects"]) for o in outs] == [1, 1, 1]
    assert info["segmenter"] == "sam-vit_tiny" and info["embedding_cache"]["encoder_forwards"] == 1
    assert info["embedding_cache"]["misses"] == 3
    # What the replica exports with ray.serve.metrics (deployments.metrics), as it counted it.
    m = info["metrics"]
    assert m["batch_sizes"] == {"3": 1} and m["ongoing_requests"] == 0
    # Each node looks its image up twice: the batch (3 misses), then the decoder (3 memory hits).
    assert m["embedding_cache"] == {"memory_hit": 3, "store_hit": 0, "miss": 3}
    assert m["nodes"]["PROCESS_APPROVED_BOX_LIST:ok"]["runs"] == 3
    m = dep.describe()["metrics"]
    assert m["embedding_cache"] == {"memory_hit": 9, "store_hit": 0, "miss": 3}
    assert sum(m["batch_sizes"].values()) == 2 and m["nodes"]["PROCESS_APPROVED_BOX_LIST:ok"]["runs"] == 6
