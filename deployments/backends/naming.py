"""Naming a manual box that was sent without a label (docs/protocol.md § Second round).

A validator backend that can name boxes has ``name_boxes`` (``BoxNamer``); the validator node asks
it about every unlabelled manual box of round 1 and takes its name when the confidence reaches the
backend's ``naming_threshold`` (``NAMING_THRESHOLD`` unless the ``--config`` file's
``BoxValidator.options.naming_threshold`` says otherwise). Below it, or with a backend that cannot
name, the box goes back to the reviewer: "name this box". Plain Python (numpy only), like ``base``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from .base import box_iou

# The least confidence at which a backend's name for a box is taken without asking the reviewer.
NAMING_THRESHOLD = 0.5
# A proposal names a box when it overlaps it at least this much (intersection over union: the
# PASCAL VOC match); less overlap scales its confidence down in proportion.
MATCH_IOU = 0.5


@runtime_checkable
class BoxNamer(Protocol):
    name: str
    naming_threshold: float

    def name_boxes(self, image: Any, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """For ``[{"box_id", "bbox"}]`` return ``[{"box_id", "label": str | None, "score": float in
        [0, 1]}]`` in the same order: the backend's best name for what the box holds, and how sure it
        is (``label`` None: nothing to name)."""
        ...


def check_threshold(value: float) -> float:
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError("naming_threshold must lie in [0, 1]")
    return float(value)


def best_match(detections: Iterable[dict[str, Any]], bbox: Any) -> tuple[str | None, float]:
    """The label of the proposal that best matches ``bbox`` and its confidence: the proposal's score,
    scaled by ``IoU / MATCH_IOU`` when it overlaps the box less than ``MATCH_IOU``; (None, 0.0) when
    nothing overlaps."""
    label: str | None = None
    best = 0.0
    for d in detections:
        conf = float(d["score"]) * min(1.0, box_iou(d["bbox"], bbox) / MATCH_IOU)
        if conf > best and d.get("label"):
            label, best = str(d["label"]), conf
    return label, best
