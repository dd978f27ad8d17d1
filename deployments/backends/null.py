"""Zero-cost backends (``hitl up --detector null --segmenter null``): answers of the right shape
with no model behind them, so a benchmark measures the control plane's own cost, not the models'.

- ``NullDetector``: two fixed boxes at fixed fractions of the image (label ``object``), best first.
- ``NullValidator``: passes every box that lies on the image (score 1.0); a box off the image
  still fails with ``box_problem``'s reason, as every validator must say why.
- ``NullSegmenter``: the box itself as the mask (``segment``), and the prompted box grown to
  its positive points (``segment_prompt``, for ``REFINE`` and the live preview).

None reads a pixel beyond the image's size; ``--detector-delay-ms`` and ``--segmenter-delay-ms``
still add their sleep (``base.DelayedDetector``/``DelayedSegmenter``), so a run can stand in for a
model of a given latency. Each is named ``null`` in the logs and in /readyz.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import box_problem, check_image, int_box, invalid_result, register
from .prompts import check_prompt

# (x1, y1, x2, y2) as fractions of the width and height, and the score each box gets.
BOXES = (((0.1, 0.1, 0.45, 0.9), 0.9), ((0.55, 0.2, 0.9, 0.8), 0.8))


@register("detector", "null")
class NullDetector:
    """Fixed boxes from the image's size: ``boxes`` of ``BOXES`` (1 or 2), label ``label``."""

    name = "null"

    def __init__(self, boxes: int = 2, label: str = "object") -> None:
        if not 1 <= int(boxes) <= len(BOXES):
            raise ValueError(f"boxes must be 1..{len(BOXES)}")
        self.boxes = int(boxes)
        self.label = label

    def detect(self, image: np.ndarray, image_sha: str) -> list[dict[str, Any]]:
        h, w = check_image(image).shape[:2]
        return [
            {
                "bbox": [round(fx1 * w, 2), round(fy1 * h, 2), round(fx2 * w, 2), round(fy2 * h, 2)],
                "label": self.label,
                "score": score,
            }
            for (fx1, fy1, fx2, fy2), score in BOXES[: self.boxes]
        ]


@register("validator", "null")
class NullValidator:
    """Every box on the image passes with score 1.0."""

    name = "null"
    policy_version = "null-pass-v1"

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = float(threshold)

    def validate(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        h, w = check_image(image).shape[:2]
        out = []
        for b in boxes:
            problem = box_problem(b.get("bbox"), w, h)
            out.append(
                invalid_result(b["box_id"], problem)
                if problem
                else {"box_id": b["box_id"], "passed": True, "score": 1.0, "reason": None}
            )
        return out


def box_mask(bbox: Any, width: int, height: int) -> np.ndarray:
    """A bool ``height x width`` mask that is true on the pixels ``bbox`` covers."""
    x1, y1, x2, y2 = int_box(bbox, width, height)
    mask = np.zeros((height, width), bool)
    mask[y1:y2, x1:x2] = True
    return mask


@register("segmenter", "null")
class NullSegmenter:
    """The box is the mask."""

    name = "null"

    def segment(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        h, w = check_image(image).shape[:2]
        out: list[dict[str, Any]] = []
        for b in boxes:
            problem = box_problem(b.get("bbox"), w, h)
            if problem:
                out.append({"box_id": b["box_id"], "mask": np.zeros((h, w), bool), "reason": problem})
            else:
                out.append({"box_id": b["box_id"], "mask": box_mask(b["bbox"], w, h), "method": "null"})
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
        """The box grown to take in every positive point: one candidate, no scores."""
        pts = check_prompt(image, bbox, points)
        h, w = image.shape[:2]
        x1, y1, x2, y2 = (float(v) for v in bbox)
        for x, y, positive in pts:
            if positive:
                x1, y1, x2, y2 = min(x1, x), min(y1, y), max(x2, x + 1), max(y2, y + 1)
        return [{"mask": box_mask([x1, y1, x2, y2], w, h), "predicted_iou": None, "stability": None}]
