"""A ``torchvision.models.detection`` detector loaded from a local weights file.

The architecture is built with ``weights=None, weights_backbone=None`` (nothing is
downloaded) and the user's file is loaded into it. Label names come from the weights
enum's metadata, which ships inside torchvision (no download), unless ``labels`` is given
for a model trained on other classes.

The same model names manual boxes sent without a label (``classify_boxes``; the ``torchvision``
validator: the classical validator's geometry and this model's names, docs/protocol.md § Second round).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchvision.models import detection as tv_detection
from torchvision.models import get_model, get_model_weights, list_models

from .base import ModelLoadError, box_problem, check_image, int_box, register
from .classical import ClassicalValidator
from .naming import NAMING_THRESHOLD, best_match, check_threshold

log = logging.getLogger(__name__)

_SKIP_LABELS = {"__background__", "N/A", "no person"}


def coco_categories(arch: str) -> list[str]:
    """The category names of ``arch``'s released weights (COCO: 91 entries with N/A gaps)."""
    return list(get_model_weights(arch).DEFAULT.meta["categories"])


def _threshold_kwargs(arch: str, score_threshold: float, max_detections: int) -> dict[str, Any]:
    """Lower the model's own score floor to ours, so ``score_threshold`` below it is honoured."""
    if "rcnn" in arch:
        return {"box_score_thresh": score_threshold, "box_detections_per_img": max_detections}
    if arch.startswith(("retinanet", "fcos", "ssd")):
        return {"score_thresh": score_threshold, "detections_per_img": max_detections}
    return {}


@register("detector", "torchvision")
class TorchvisionDetector:
    """``detect`` returns boxes with COCO (or ``labels``) names, scores at or above
    ``score_threshold``, best first, at most ``max_detections``; ``include_labels`` keeps
    only those class names (e.g. the product classes of a shop)."""

    def __init__(
        self,
        weights: str | os.PathLike[str] | None = None,
        arch: str = "fasterrcnn_mobilenet_v3_large_320_fpn",
        score_threshold: float = 0.5,
        max_detections: int = 20,
        device: str | None = None,
        labels: list[str] | None = None,
        include_labels: list[str] | None = None,
    ) -> None:
        if arch not in list_models(module=tv_detection):
            raise ModelLoadError(
                f"unknown torchvision detection architecture {arch!r}; choose one of "
                f"{', '.join(list_models(module=tv_detection))}"
            )
        if not 0.0 <= float(score_threshold) <= 1.0:
            raise ValueError("score_threshold must lie in [0, 1]")
        self.arch = arch
        self.name = f"torchvision-{arch}"
        self.score_threshold = float(score_threshold)
        self.max_detections = int(max_detections)
        self.categories = list(labels) if labels else coco_categories(arch)
        self.include_labels = set(include_labels) if include_labels else None
        if device in (None, "", "auto"):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model = self._load(weights)

    def _load(self, weights: str | os.PathLike[str] | None) -> torch.nn.Module:
        if not weights:
            raise ModelLoadError(f"the torchvision detector {self.arch} needs a local weights file (weights=...)")
        path = Path(weights).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"detector weights {str(path)!r} do not exist (architecture {self.arch})")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ModelLoadError(f"cannot read detector weights {str(path)!r}: {exc}") from exc
        if isinstance(state, dict) and isinstance(state.get("model"), dict):
            state = state["model"]
        if not isinstance(state, dict):
            raise ModelLoadError(f"detector weights {str(path)!r} hold a {type(state).__name__}, not a state dict")
        model = get_model(
            self.arch,
            weights=None,
            weights_backbone=None,
            num_classes=len(self.categories),
            **_threshold_kwargs(self.arch, self.score_threshold, self.max_detections),
        )
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            detail = " ".join(str(exc).splitlines()[:3])[:400]
            raise ModelLoadError(
                f"detector weights {str(path)!r} do not match architecture {self.arch!r} "
                f"with {len(self.categories)} classes: {detail}"
            ) from exc
        if self.device.type == "cpu":
            log.info("torchvision detector %s runs on CPU", self.arch)
        return model.to(self.device).eval()

    def detect(self, image: np.ndarray, image_sha: str) -> list[dict[str, Any]]:
        check_image(image)
        x = torch.as_tensor(image, device=self.device).permute(2, 0, 1).float().div_(255.0)
        with torch.inference_mode():
            pred = self.model([x])[0]
        h, w = image.shape[:2]
        out = []
        order = torch.argsort(pred["scores"], descending=True)
        for i in order.tolist():
            score = float(pred["scores"][i])
            if score < self.score_threshold:
                break
            idx = int(pred["labels"][i])
            label = self.categories[idx] if 0 <= idx < len(self.categories) else str(idx)
            if label in _SKIP_LABELS or (self.include_labels is not None and label not in self.include_labels):
                continue
            x1, y1, x2, y2 = (float(v) for v in pred["boxes"][i].tolist())
            x1, y1, x2, y2 = max(0.0, x1), max(0.0, y1), min(float(w), x2), min(float(h), y2)
            if x2 - x1 < 1 or y2 - y1 < 1:
                continue
            out.append(
                {
                    "bbox": [round(x1, 2), round(y1, 2), round(x2, 2), round(y2, 2)],
                    "label": label,
                    "score": round(min(1.0, max(0.0, score)), 4),
                }
            )
            if len(out) >= self.max_detections:
                break
        return out

    def _allowed(self) -> torch.Tensor:
        """Which class indices may name a box: not the background or N/A, and in ``include_labels``."""
        names = self.categories
        keep = [n not in _SKIP_LABELS and (self.include_labels is None or n in self.include_labels) for n in names]
        return torch.tensor(keep, dtype=torch.bool, device=self.device)

    def classify_boxes(self, image: np.ndarray, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each box's best class and its probability, ``[{"box_id", "label", "score"}]`` in order.

        Two-stage architectures (the R-CNNs) classify the box itself: the box is the region proposal,
        its features are pooled from the backbone (RoIAlign) and the box head's classifier gives a
        softmax over the classes; the best allowed class and its probability name it. One-stage ones
        (RetinaNet, FCOS, SSD) have no such head: the detector runs on the box and a margin around it
        and its best detection matching the box names it (``naming.best_match``)."""
        check_image(image)
        h, w = image.shape[:2]
        usable = [b for b in boxes if box_problem(b.get("bbox"), w, h) is None]
        names: dict[str, tuple[str | None, float]] = {}
        roi_heads = getattr(self.model, "roi_heads", None)
        if usable and roi_heads is not None:
            names = self._classify_rois(image, usable)
        elif usable:
            for b in usable:
                x1, y1, x2, y2 = int_box(b["bbox"], w, h)
                mx, my = max(4, (x2 - x1) // 4), max(4, (y2 - y1) // 4)
                cx1, cy1, cx2, cy2 = max(0, x1 - mx), max(0, y1 - my), min(w, x2 + mx), min(h, y2 + my)
                found = self.detect(np.ascontiguousarray(image[cy1:cy2, cx1:cx2]), "")
                names[b["box_id"]] = best_match(found, [x1 - cx1, y1 - cy1, x2 - cx1, y2 - cy1])
        out = []
        for b in boxes:
            label, score = names.get(b["box_id"], (None, 0.0))
            out.append({"box_id": b["box_id"], "label": label, "score": round(float(score), 4)})
        return out

    def _classify_rois(self, image: np.ndarray, boxes: list[dict[str, Any]]) -> dict[str, tuple[str | None, float]]:
        model: Any = self.model
        heads = model.roi_heads
        h, w = image.shape[:2]
        x = torch.as_tensor(image, device=self.device).permute(2, 0, 1).float().div_(255.0)
        with torch.inference_mode():
            images, _ = model.transform([x])
            th, tw = images.image_sizes[0]
            scale = torch.tensor([tw / w, th / h, tw / w, th / h], device=self.device)
            rois = torch.tensor([list(b["bbox"]) for b in boxes], dtype=torch.float32, device=self.device) * scale
            features = model.backbone(images.tensors)
            pooled = heads.box_roi_pool(features, [rois], images.image_sizes)
            logits, _ = heads.box_predictor(heads.box_head(pooled))
            probs = torch.softmax(logits, dim=-1)
            probs = torch.where(self._allowed()[: probs.shape[1]], probs, torch.zeros_like(probs))
            best, idx = probs.max(dim=-1)
        out: dict[str, tuple[str | None, float]] = {}
        for b, p, i in zip(boxes, best.tolist(), idx.tolist(), strict=True):
            out[b["box_id"]] = (self.categories[i], float(p)) if p > 0 and i < len(self.categories) else (None, 0.0)
        return out


@register("validator", "torchvision")
class TorchvisionValidator(ClassicalValidator):
    """The classical validator's geometry (does the box hold one subject?) and the torchvision
    detector's classifier to name boxes sent without a label (``TorchvisionDetector.classify_boxes``):
    a COCO name (or one of ``labels``) and its softmax probability, taken from ``naming_threshold`` up.
    Takes the detector's ``weights``, ``arch``, ``device``, ``labels`` and ``include_labels``."""

    def __init__(
        self,
        weights: str | os.PathLike[str] | None = None,
        arch: str = "fasterrcnn_mobilenet_v3_large_320_fpn",
        device: str | None = None,
        labels: list[str] | None = None,
        include_labels: list[str] | None = None,
        naming_threshold: float = NAMING_THRESHOLD,
        **classical: Any,
    ) -> None:
        super().__init__(naming_threshold=check_threshold(naming_threshold), **classical)
        self.classifier = TorchvisionDetector(
            weights, arch, score_threshold=0.0, device=device, labels=labels, include_labels=include_labels
        )
        self.name = self.classifier.name
        self.policy_version = f"{ClassicalValidator.policy_version}+names-{arch}"

    def name_boxes(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.classifier.classify_boxes(image, boxes)
