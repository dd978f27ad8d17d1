"""Mask-against-ground-truth metrics for the cut-out benchmark and its tests.

- ``mask_iou``: intersection over union of two bool masks (the region metric);
- ``boundary_f``: the boundary F-score (Martin et al., BSDS; the DAVIS "F"): the share of the
  predicted outline within ``tol_px`` of the true outline (precision) and the share of the
  true outline within ``tol_px`` of the predicted one (recall), their harmonic mean. IoU
  hardly moves when a big mask's edge is ragged; a customer sees the edge, so both count.

Both treat two empty masks as a perfect match and one empty mask against a non-empty one as
a complete miss.
"""

from __future__ import annotations

import cv2
import numpy as np


def _check_pair(pred: np.ndarray, gt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if pred.shape != gt.shape or pred.ndim != 2:
        raise ValueError(f"masks must be 2-D and of one shape, got {pred.shape} and {gt.shape}")
    return pred.astype(bool), gt.astype(bool)


def mask_iou(pred: np.ndarray, gt: np.ndarray) -> float:
    p, g = _check_pair(pred, gt)
    union = int(np.count_nonzero(p | g))
    if union == 0:
        return 1.0
    return int(np.count_nonzero(p & g)) / union


def boundary(mask: np.ndarray) -> np.ndarray:
    """The mask's outline: its pixels with one of their 8 neighbours outside it (the image's edge
    counts as outside, so a mask running off the frame has an outline there too)."""
    m = mask.astype(np.uint8)
    eroded = cv2.erode(m, np.ones((3, 3), np.uint8), borderType=cv2.BORDER_CONSTANT, borderValue=0)
    return mask.astype(bool) & (eroded == 0)


def _distance_to(outline: np.ndarray) -> np.ndarray:
    """Euclidean distance of every pixel to the nearest pixel of ``outline``."""
    return cv2.distanceTransform((~outline).astype(np.uint8), cv2.DIST_L2, cv2.DIST_MASK_PRECISE)


def boundary_f(pred: np.ndarray, gt: np.ndarray, tol_px: float = 2.0) -> float:
    p, g = _check_pair(pred, gt)
    bp, bg = boundary(p), boundary(g)
    n_p, n_g = int(np.count_nonzero(bp)), int(np.count_nonzero(bg))
    if n_p == 0 and n_g == 0:
        return 1.0
    if n_p == 0 or n_g == 0:
        return 0.0
    precision = float(np.count_nonzero(_distance_to(bg)[bp] <= tol_px)) / n_p
    recall = float(np.count_nonzero(_distance_to(bp)[bg] <= tol_px)) / n_g
    if precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)
