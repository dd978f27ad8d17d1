"""Box-plus-points prompts, shared by every ``PromptedSegmenter``: checking them, the area a
prompted mask may cover, and its clean-up.

A reviewer who clicks a positive point outside the drawn box is saying the subject runs on
past it, so a prompted mask is clipped to the box grown past the positive points, not to the
box alone. The clean-up keeps every component a positive point lands on (a subject in
two visible parts stays whole) and never fills a hole a negative point marks (a mug's
handle the reviewer opened stays open).

OpenCV is imported on first use, as in ``postprocess``: the SAM backends import this file.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import box_problem, check_image, check_points, int_box

Point = tuple[float, float, bool]


def check_prompt(image: np.ndarray, bbox: Any, points: Any) -> list[Point]:
    """The points as ``(x, y, positive)``; ``ValueError`` for a bad image, box or point."""
    h, w = check_image(image).shape[:2]
    problem = box_problem(bbox, w, h)
    if problem:
        raise ValueError(problem)
    return check_points(points, w, h)


def pixel(x: float, y: float, width: int, height: int) -> tuple[int, int]:
    """The pixel a point in image coordinates falls on (a point on the far edge: the last pixel)."""
    return min(width - 1, int(x)), min(height - 1, int(y))


OUTSIDE_GROW = 0.25  # past a positive point outside the box, a quarter of the box's size more


def prompt_bounds(bbox: Any, points: list[Point], width: int, height: int) -> tuple[int, int, int, int]:
    """Pixel bounds (x2, y2 exclusive) of the box grown to hold every positive point: a side with
    a positive point past it moves to the point plus ``OUTSIDE_GROW`` of the box's size (the
    subject runs on past the click), clipped to the image."""
    bx1, by1, bx2, by2 = int_box(bbox, width, height)
    gx, gy = round(OUTSIDE_GROW * (bx2 - bx1)), round(OUTSIDE_GROW * (by2 - by1))
    x1, y1, x2, y2 = bx1, by1, bx2, by2
    for x, y, positive in points:
        if not positive:
            continue
        px, py = pixel(x, y, width, height)
        if px < bx1:
            x1 = min(x1, max(0, px - gx))
        if px >= bx2:
            x2 = max(x2, min(width, px + 1 + gx))
        if py < by1:
            y1 = min(y1, max(0, py - gy))
        if py >= by2:
            y2 = max(y2, min(height, py + 1 + gy))
    return x1, y1, x2, y2


def clean_prompted_mask(
    mask: np.ndarray, points: list[Point], bounds: tuple[int, int, int, int] | None, max_hole_frac: float = 0.1
) -> np.ndarray:
    """Clip to ``bounds``, keep the components holding a positive point (the largest one when no
    positive point lands on the mask), fill small holes except those holding a negative point."""
    import cv2

    h, w = mask.shape
    m = mask.astype(bool)
    if bounds is not None:
        x1, y1, x2, y2 = bounds
        clipped = np.zeros_like(m)
        clipped[y1:y2, x1:x2] = m[y1:y2, x1:x2]
        m = clipped
    if not m.any():
        return m
    n, labels, stats, _ = cv2.connectedComponentsWithStats(m.astype(np.uint8), connectivity=8)
    keep = {int(labels[py, px]) for px, py in (pixel(x, y, w, h) for x, y, pos in points if pos)} - {0}
    if not keep:
        keep = {1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))}
    m = np.isin(labels, list(keep))
    inv = (~m).astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(inv, connectivity=4)
    opened = {int(labels[py, px]) for px, py in (pixel(x, y, w, h) for x, y, pos in points if not pos)}
    limit = max_hole_frac * int(m.sum())
    x, y, bw, bh, area = (stats[1:, k] for k in range(5))
    enclosed = (x > 0) & (y > 0) & (x + bw < w) & (y + bh < h) & (area <= limit)
    fill = [i for i in np.flatnonzero(enclosed) + 1 if int(i) not in opened]
    if fill:
        m |= np.isin(labels, fill)
    return m
