"""The three SAM backends: box validator, segmenter and automatic-mask detector.

They register themselves in ``deployments.backends.base`` under ``sam`` and ``sam-auto``;
the factories there import this module on first use, so the classical default never
imports torch.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from segment_anything import SamAutomaticMaskGenerator, SamPredictor

from ..base import box_iou, box_problem, check_image, int_box, invalid_result, mask_bbox, register
from ..postprocess import clean_mask, feather
from ..prompts import check_prompt, clean_prompted_mask, prompt_bounds
from .encoder import SamEncoder, encoder_from


@register("segmenter", "sam", "sam-auto", takes_artifacts=True)
class SamSegmenter:
    """Masks from box prompts: every box of an image in one decoder call, then clean-up
    (clip to the box, largest component, small holes filled, optional feathered alpha)."""

    def __init__(
        self,
        encoder: SamEncoder | None = None,
        *,
        multimask: bool = False,
        clip_to_box: bool = True,
        max_hole_frac: float = 0.1,
        feather_px: float = 0.0,
        **model_cfg: Any,
    ) -> None:
        self.encoder = encoder_from(encoder, model_cfg)
        self.name = f"sam-{self.encoder.model.model_type}"
        self.multimask = multimask
        self.clip_to_box = clip_to_box
        self.max_hole_frac = float(max_hole_frac)
        self.feather_px = float(feather_px)

    def segment(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        h, w = check_image(image).shape[:2]
        problems = {b["box_id"]: box_problem(b.get("bbox"), w, h) for b in boxes}
        good = [b for b in boxes if problems[b["box_id"]] is None]
        masks: dict[str, np.ndarray] = {}
        scores: dict[str, float] = {}
        if good:
            emb = self.encoder.embed(image, image_sha)
            raw, iou = self.encoder.model.predict_boxes(
                emb, np.array([b["bbox"] for b in good], np.float32), self.multimask
            )
            for b, m, q in zip(good, raw, iou, strict=True):
                scores[b["box_id"]] = float(min(1.0, max(0.0, q)))  # the decoder's own, for the gate
                if self.clip_to_box:
                    x1, y1, x2, y2 = int_box(b["bbox"], w, h)
                    clip = np.zeros_like(m)
                    clip[y1:y2, x1:x2] = True
                    m = m & clip
                masks[b["box_id"]] = clean_mask(m, self.max_hole_frac)
        out = []
        for b in boxes:
            mask = masks.get(b["box_id"])
            if mask is None:
                out.append({"box_id": b["box_id"], "mask": np.zeros((h, w), bool), "reason": problems[b["box_id"]]})
                continue
            item: dict[str, Any] = {"box_id": b["box_id"], "mask": mask, "predicted_iou": scores[b["box_id"]]}
            if not mask.any():
                item["reason"] = "the model found no object inside the box"
            elif self.feather_px > 0:
                item["alpha"] = feather(mask, self.feather_px)
            out.append(item)
        return out

    def segment_prompt(
        self,
        image: np.ndarray,
        image_sha: str,
        bbox: list[float],
        points: list[dict[str, Any]],
        *,
        multimask: bool = False,
    ) -> list[dict[str, Any]]:
        """The box and the clicks as one SAM prompt (``point_coords``/``point_labels`` plus ``box``)
        on the cached image embedding; candidates sorted by the decoder's predicted IoU, each
        with the stability score computed on its logits before clean-up. With ``clip_to_box``
        the mask is clipped to the box grown to hold the positive points."""
        pts = check_prompt(image, bbox, points)
        h, w = image.shape[:2]
        emb = self.encoder.embed(image, image_sha)
        coords = np.array([(x, y) for x, y, _ in pts], np.float32).reshape(-1, 2)
        labels = np.array([1 if pos else 0 for _, _, pos in pts], np.int64)
        masks, ious, stability = self.encoder.model.predict_prompt(
            emb, np.asarray(bbox, np.float32), coords, labels, multimask
        )
        bounds = prompt_bounds(bbox, pts, w, h) if self.clip_to_box else None
        out = [
            {
                "mask": clean_prompted_mask(m, pts, bounds, self.max_hole_frac),
                "predicted_iou": float(np.clip(iou, 0.0, 1.0)),
                "stability": float(np.clip(st, 0.0, 1.0)),
            }
            for m, iou, st in zip(masks, ious, stability, strict=True)
        ]
        return sorted(out, key=lambda c: -c["predicted_iou"])


@register("validator", "sam", "sam-auto", takes_artifacts=True)
class SamValidator:
    """``score = predicted IoU x box agreement`` for the box prompt, both in [0, 1].

    The decoder's IoU head says how good it thinks its mask is; the agreement (IoU of the
    mask's bounding box with the drawn box) says whether that mask is the object the box
    frames, rather than a fragment of it or something bigger."""

    def __init__(self, encoder: SamEncoder | None = None, *, threshold: float = 0.5, **model_cfg: Any) -> None:
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError("threshold must lie in [0, 1]")
        self.encoder = encoder_from(encoder, model_cfg)
        self.threshold = float(threshold)
        self.name = f"sam-{self.encoder.model.model_type}"
        self.policy_version = f"sam-{self.encoder.model.model_type}-iou-x-boxagree-v1"

    def validate(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        h, w = check_image(image).shape[:2]
        problems = {b["box_id"]: box_problem(b.get("bbox"), w, h) for b in boxes}
        good = [b for b in boxes if problems[b["box_id"]] is None]
        verdicts: dict[str, dict[str, Any]] = {}
        if good:
            emb = self.encoder.embed(image, image_sha)
            masks, ious = self.encoder.model.predict_boxes(emb, np.array([b["bbox"] for b in good], np.float32))
            for b, m, iou in zip(good, masks, ious, strict=True):
                verdicts[b["box_id"]] = self._verdict(b, m, float(iou))
        return [verdicts.get(b["box_id"]) or invalid_result(b["box_id"], str(problems[b["box_id"]])) for b in boxes]

    def _verdict(self, box: dict[str, Any], mask: np.ndarray, iou_pred: float) -> dict[str, Any]:
        q = float(np.clip(iou_pred, 0.0, 1.0))
        mb = mask_bbox(clean_mask(mask)) if mask.any() else None
        agree = box_iou(mb, box["bbox"]) if mb else 0.0
        score = q * agree
        reason = None
        if score < self.threshold:
            if mb is None:
                why = "the model found no object inside the box"
            elif agree < q:
                why = "the object the model found does not fill the box: draw it around the whole subject"
            else:
                why = "the model is not confident there is one clear subject in the box"
            reason = f"{why} (score {score:.2f} < {self.threshold:.2f})"
        return {"box_id": box["box_id"], "passed": reason is None, "score": round(score, 4), "reason": reason}


def _same_pixels(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` is ``b`` or a full-size view of it (the generator's layer-0 "crop")."""
    return a.shape == b.shape and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


class _CachedPredictor(SamPredictor):
    """A ``SamPredictor`` whose ``set_image`` serves the full image from the shared embedding
    cache (crops of ``crop_n_layers`` > 0 still go through the encoder)."""

    def __init__(self, encoder: SamEncoder) -> None:
        super().__init__(encoder.model.sam)
        self.encoder = encoder
        self.current: tuple[np.ndarray, str] | None = None

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        if self.current is not None and _same_pixels(image, self.current[0]):
            emb = self.encoder.embed(image, self.current[1])
            self.reset_image()
            self.features, self.original_size, self.input_size = emb.features, emb.original_size, emb.input_size
            self.is_image_set = True
            return
        super().set_image(image, image_format)


@register("detector", "sam-auto", "sam", takes_artifacts=True)
class SamAutoDetector:
    """Proposals from ``SamAutomaticMaskGenerator``: one box per mask, ``score = predicted IoU x
    stability``, near-duplicates removed by NMS, frame-filling masks (the background) dropped,
    at most ``max_detections``."""

    def __init__(
        self,
        encoder: SamEncoder | None = None,
        *,
        points_per_side: int = 16,
        points_per_batch: int = 64,
        pred_iou_thresh: float = 0.8,
        stability_score_thresh: float = 0.9,
        nms_iou: float = 0.5,
        max_area_frac: float = 0.95,
        min_area_frac: float = 0.002,
        max_detections: int = 10,
        min_score: float = 0.0,
        label: str = "object",
        **model_cfg: Any,
    ) -> None:
        self.encoder = encoder_from(encoder, model_cfg)
        self.name = f"sam-auto-{self.encoder.model.model_type}"
        self.nms_iou = float(nms_iou)
        self.max_area_frac = float(max_area_frac)
        self.min_area_frac = float(min_area_frac)
        self.max_detections = int(max_detections)
        self.min_score = float(min_score)
        self.label = label
        self.generator = SamAutomaticMaskGenerator(
            self.encoder.model.sam,
            points_per_side=points_per_side,
            points_per_batch=points_per_batch,
            pred_iou_thresh=pred_iou_thresh,
            stability_score_thresh=stability_score_thresh,
        )
        self._predictor = _CachedPredictor(self.encoder)
        self.generator.predictor = self._predictor
        self._lock = threading.Lock()  # the generator keeps per-image state in its predictor

    def detect(self, image: np.ndarray, image_sha: str) -> list[dict[str, Any]]:
        from torchvision.ops import nms

        h, w = check_image(image).shape[:2]
        with self._lock:
            self._predictor.current = (image, image_sha)
            try:
                # No autocast here: the generator hands bf16 tensors to numpy, which has no bf16.
                # The full-image embedding still comes from the (autocast) encoder via the cache.
                with torch.inference_mode():
                    records = self.generator.generate(image)
            finally:
                self._predictor.current = None
        boxes, scores = [], []
        for r in records:
            # The generator's XYWH comes from inclusive pixel indices: the mask spans w + 1 columns.
            x, y, bw, bh = (float(v) for v in r["bbox"])
            bw, bh = bw + 1.0, bh + 1.0
            area_frac = (bw * bh) / float(h * w)
            if bw < 2 or bh < 2 or area_frac > self.max_area_frac or r["area"] < self.min_area_frac * h * w:
                continue
            score = float(np.clip(r["predicted_iou"], 0, 1) * np.clip(r["stability_score"], 0, 1))
            if score < self.min_score:
                continue
            boxes.append([x, y, min(float(w), x + bw), min(float(h), y + bh)])
            scores.append(score)
        if not boxes:
            return []
        keep = nms(
            torch.tensor(boxes, dtype=torch.float32), torch.tensor(scores, dtype=torch.float32), self.nms_iou
        ).tolist()[: self.max_detections]
        return [
            {"bbox": [round(v, 2) for v in boxes[i]], "label": self.label, "score": round(scores[i], 4)} for i in keep
        ]
