"""``REFINE_SUBJECT``'s prompt strategies: another try at a mask the quality gate failed (SPEC §13).

Attempt ``n`` (1-based) runs ``STRATEGIES[n - 1]``. ``enlarged_box`` comes first because on the
synthetic checks (``tests/test_refine.py``) it is the one that mends a box drawn short (mask IoU
0.78 -> 0.96 with the classical segmenter) and it mends a box-filling or fragment mask as
well; ``alt_multimask`` second because on SAM it costs one decoder call on the cached
embedding. These checks are synthetic; the labelled benchmark should settle the order. Each
works with any ``PromptedSegmenter`` (classical or SAM):

- ``enlarged_box``: the box grown by a quarter on every side that cuts the subject (the failed
  mask reaches the side and the picture carries on across it in the same colour), by 5%
  elsewhere, prompted again: a box drawn too short is a common failure, and the segmenter
  clips to its box.
- ``alt_multimask``: the segmenter's other candidates for the same box, best by predicted IoU
  times stability (in the segmenter's order when it has no scores), skipping any that is
  the failed mask again (IoU >= 0.9 with it).
- ``mask_points``: the box plus points read off the failed mask: a positive point at its
  most interior pixel (the distance transform's maximum; the box's centre when the mask is
  empty), a negative point near each corner of the box the failed mask leaves uncovered and
  that does not share the subject's colour.
- ``edge_grabcut``: edge-aware, the same for every segmenter: GrabCut (OpenCV) with the
  failed mask as probable foreground, the rest of the box (grown as for ``enlarged_box``) as
  probable background, so the outline moves onto the image's colour edges.

An attempt past the last strategy raises ``ValueError``: the caller sends the subject to a
person (``WAITING_MASK_REVIEW``) rather than retry a strategy already tried.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from ..backends.background import to_lab
from ..backends.base import PromptedSegmenter, int_box
from ..backends.grabcut_points import REGION_TOL, Variant, grabcut_prompt
from ..backends.prompts import check_prompt, pixel
from .metrics import mask_iou

STRATEGIES: tuple[str, ...] = ("enlarged_box", "alt_multimask", "mask_points", "edge_grabcut")

SAME_MASK_IOU = 0.9  # a candidate this close to the failed mask is the failed mask again
GROW_CUT = 0.25  # growth of a box side that cuts the subject, fraction of the box's size
GROW_OTHER = 0.05
TOUCH_FRAC = 0.1  # a side cuts the subject when it runs on across this share of the side
PROBE_PX = 3  # how far inside and outside a box side its colours are compared
CORNER_INSET = 0.05
EDGE_VARIANT = Variant("edge-grabcut", "prior", 0.015, 5)


def refine(
    segmenter: PromptedSegmenter,
    image: np.ndarray,
    image_sha: str,
    bbox: list[float],
    failed_mask: np.ndarray,
    attempt: int,
) -> dict[str, Any]:
    """Attempt ``attempt`` (1-based) at a better mask than ``failed_mask`` for the subject in
    ``bbox``: ``{"mask": bool H x W, "strategy", "bbox", "predicted_iou", "stability"}`` (``bbox``: the
    box the mask was made for, grown by ``enlarged_box`` and ``edge_grabcut``; scores None when the
    strategy or the segmenter has none). ``ValueError`` for an attempt outside
    ``1..len(STRATEGIES)``, a bad box, or a mask not of the image's size."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= len(STRATEGIES):
        raise ValueError(
            f"attempt {attempt!r} is outside 1..{len(STRATEGIES)}: there are {len(STRATEGIES)} refinement "
            f"strategies ({', '.join(STRATEGIES)}); past them the subject goes to a person"
        )
    check_prompt(image, bbox, [])
    h, w = image.shape[:2]
    if not isinstance(failed_mask, np.ndarray) or failed_mask.shape != (h, w):
        raise ValueError(f"failed_mask must be an array of the image's size {h}x{w}")
    failed = failed_mask.astype(bool)
    strategy = STRATEGIES[attempt - 1]
    prompted = list(bbox)  # the box the new mask was made for: what the gate judges it against
    if strategy == "enlarged_box":
        prompted = grown_box(image, failed, bbox)
        best = segmenter.segment_prompt(image, image_sha, prompted, [])[0]
    elif strategy == "alt_multimask":
        best = pick_other(segmenter.segment_prompt(image, image_sha, bbox, [], multimask=True), failed)
    elif strategy == "mask_points":
        best = segmenter.segment_prompt(image, image_sha, bbox, mask_points(image, failed, bbox))[0]
    else:
        prompted = grown_box(image, failed, bbox)
        mask = grabcut_prompt(image, prompted, [], EDGE_VARIANT, prior=failed)
        best = {"mask": mask, "predicted_iou": None, "stability": None}
    return {
        "mask": np.asarray(best["mask"], bool),
        "strategy": strategy,
        "bbox": [float(v) for v in prompted],
        "predicted_iou": best.get("predicted_iou"),
        "stability": best.get("stability"),
    }


def cut_sides(image: np.ndarray, mask: np.ndarray, bbox: list[float]) -> dict[str, bool]:
    """Which sides of the box cut the subject: where the mask reaches a side, the picture carries
    on across it in the same colour (within ``REGION_TOL`` Delta E, ``PROBE_PX`` inside against
    ``PROBE_PX`` outside) on ``TOUCH_FRAC`` of the side or more. A mask merely touching a side
    is a tight box; a side on the image's edge never counts, there is nothing past it."""
    height, width = mask.shape
    x1, y1, x2, y2 = int_box(bbox, width, height)
    cut = {"left": False, "top": False, "right": False, "bottom": False}
    if x2 - x1 <= 2 * PROBE_PX or y2 - y1 <= 2 * PROBE_PX or not mask[y1:y2, x1:x2].any():
        return cut
    p = PROBE_PX
    ox1, oy1 = max(0, x1 - p), max(0, y1 - p)
    lab = to_lab(image[oy1 : min(height, y2 + p), ox1 : min(width, x2 + p)])

    def at(ys: Any, xs: Any) -> np.ndarray:
        return lab[np.asarray(ys) - oy1, np.asarray(xs) - ox1]

    rows, cols = np.arange(y1, y2), np.arange(x1, x2)
    # (side reaches past the image?, mask along the side, colour inside, colour outside): the colours
    # are read only where there is room outside (a box on the image's edge has no pixels past it).
    probes: dict[str, tuple[bool, Any, Any]] = {
        "left": (x1 >= p, lambda: mask[y1:y2, x1], lambda: (at(rows, x1 + p - 1), at(rows, x1 - p))),
        "right": (x2 + p <= width, lambda: mask[y1:y2, x2 - 1], lambda: (at(rows, x2 - p), at(rows, x2 + p - 1))),
        "top": (y1 >= p, lambda: mask[y1, x1:x2], lambda: (at(y1 + p - 1, cols), at(y1 - p, cols))),
        "bottom": (y2 + p <= height, lambda: mask[y2 - 1, x1:x2], lambda: (at(y2 - p, cols), at(y2 + p - 1, cols))),
    }
    for side, (room, along, colours) in probes.items():
        if room:
            inside, outside = colours()
            same = np.linalg.norm(inside - outside, axis=-1) <= REGION_TOL
            cut[side] = bool((along() & same).mean() >= TOUCH_FRAC)
    return cut


def grown_box(image: np.ndarray, mask: np.ndarray, bbox: list[float]) -> list[float]:
    """The box grown by ``GROW_CUT`` of its size on the sides that cut the subject, ``GROW_OTHER``
    elsewhere, clipped to the image."""
    height, width = mask.shape
    x1, y1, x2, y2 = (float(v) for v in bbox)
    bw, bh = x2 - x1, y2 - y1
    cut = cut_sides(image, mask, bbox)

    def grow(side: str, size: float) -> float:
        return (GROW_CUT if cut[side] else GROW_OTHER) * size

    return [
        max(0.0, x1 - grow("left", bw)),
        max(0.0, y1 - grow("top", bh)),
        min(float(width), x2 + grow("right", bw)),
        min(float(height), y2 + grow("bottom", bh)),
    ]


def mask_points(image: np.ndarray, mask: np.ndarray, bbox: list[float]) -> list[dict[str, Any]]:
    """A positive point at the failed mask's most interior pixel inside the box (the box's centre
    when it has none there), a negative one near each box corner the mask leaves uncovered and
    whose colour differs from the positive point's (a rectangular subject fills its box's
    corners: a negative point there would cut it)."""
    height, width = mask.shape
    x1, y1, x2, y2 = int_box(bbox, width, height)
    inside = np.zeros((height, width), np.uint8)
    inside[y1:y2, x1:x2] = mask[y1:y2, x1:x2]
    if inside.any():
        dist = cv2.distanceTransform(inside, cv2.DIST_L2, 5)
        iy, ix = np.unravel_index(int(np.argmax(dist)), dist.shape)
        points = [{"x": float(ix) + 0.5, "y": float(iy) + 0.5, "positive": True}]
    else:
        points = [{"x": (x1 + x2) / 2.0, "y": (y1 + y2) / 2.0, "positive": True}]
    lab = to_lab(image[y1:y2, x1:x2])  # every point lies in the box
    px, py = pixel(points[0]["x"], points[0]["y"], width, height)
    subject = lab[py - y1, px - x1]
    dx, dy = max(1.0, CORNER_INSET * (x2 - x1)), max(1.0, CORNER_INSET * (y2 - y1))
    for cx, cy in ((x1 + dx, y1 + dy), (x2 - dx, y1 + dy), (x1 + dx, y2 - dy), (x2 - dx, y2 - dy)):
        qx, qy = pixel(cx, cy, width, height)
        if not mask[qy, qx] and float(np.linalg.norm(lab[qy - y1, qx - x1] - subject)) > REGION_TOL:
            points.append({"x": cx, "y": cy, "positive": False})
    return points


def pick_other(candidates: list[dict[str, Any]], failed: np.ndarray) -> dict[str, Any]:
    """The best-scored candidate that is not the failed mask again; the best one when all are."""

    def score(c: dict[str, Any]) -> float:
        iou, stab = c.get("predicted_iou"), c.get("stability")
        return (1.0 if iou is None else float(iou)) * (1.0 if stab is None else float(stab))

    ranked = sorted(candidates, key=lambda c: -score(c))  # stable: the segmenter's order breaks ties
    for c in ranked:
        if mask_iou(np.asarray(c["mask"], bool), failed) < SAME_MASK_IOU:
            return c
    return ranked[0]
