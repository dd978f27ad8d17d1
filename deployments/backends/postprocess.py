"""Mask clean-up shared by every segmenter: one subject per box, no pin-holes, optional soft edge.

OpenCV is imported on first use, not with the module: the SAM backends import this file,
and a bare GPU box (torch, torchvision, segment_anything only) can still load them and
time the encoder and decoder."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np


def _cv2() -> ModuleType:
    try:
        import cv2
    except ImportError as exc:  # pragma: no cover - only on machines without the project's deps
        raise ImportError("mask post-processing needs OpenCV: pip install opencv-python-headless") from exc
    return cv2


def largest_component(mask: np.ndarray) -> np.ndarray:
    """Keep the biggest 8-connected blob: a box names one subject, stray specks are noise."""
    cv2: Any = _cv2()
    m = mask.astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(m, connectivity=8)
    if n <= 2:
        return m.astype(bool)
    biggest = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    return labels == biggest


def fill_holes(mask: np.ndarray, max_hole_frac: float = 0.1) -> np.ndarray:
    """Fill enclosed background holes up to ``max_hole_frac`` of the mask's area.

    Small holes are specular highlights or labels the model missed; big ones (a mug's
    handle, a bag's strap loop) are real and stay open."""
    cv2: Any = _cv2()
    m = mask.astype(np.uint8)
    area = int(m.sum())
    if area == 0:
        return mask.astype(bool)
    inv = (1 - m).astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(inv, connectivity=4)
    h, w = m.shape
    out = m.copy()
    limit = max_hole_frac * area
    for i in range(1, n):
        x, y, bw, bh, a = stats[i]
        touches_border = x == 0 or y == 0 or x + bw == w or y + bh == h
        if not touches_border and a <= limit:
            out[labels == i] = 1
    return out.astype(bool)


def clean_mask(mask: np.ndarray, max_hole_frac: float = 0.1) -> np.ndarray:
    return fill_holes(largest_component(mask), max_hole_frac)


def feather(mask: np.ndarray, radius_px: float) -> np.ndarray:
    """A uint8 alpha that ramps from the mask's outline to opaque ``radius_px`` pixels inside.

    The ramp lies inside the mask only, so the cut-out never grows a halo of background colour."""
    m = mask.astype(np.uint8)
    if radius_px <= 0 or not m.any():
        return m * 255
    cv2: Any = _cv2()
    dist = cv2.distanceTransform(m, cv2.DIST_L2, 3)
    return (np.clip(dist / float(radius_px), 0.0, 1.0) * 255).round().astype(np.uint8)
