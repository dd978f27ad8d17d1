"""The background model the classical backends share, measured in CIELAB (Delta E 76).

The background is what the picture's border (or the ring just outside a box) looks like;
an object is a region that differs from it by clearly more than the background's own
noise. ``BoxEvidence`` is that comparison for one box: used by the validator to score a
box and by the segmenter to seed GrabCut.
"""

from __future__ import annotations

import cv2
import numpy as np

MIN_CONTRAST = 6.0  # Delta E: below this nobody calls it "a different colour"


def resize_max(image: np.ndarray, max_side: int) -> tuple[np.ndarray, float]:
    """Downscale so the long side is at most ``max_side``; returns the image and the factor applied."""
    h, w = image.shape[:2]
    s = min(1.0, max_side / float(max(h, w)))
    if s >= 1.0:
        return image, 1.0
    return cv2.resize(image, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA), s


def to_lab(rgb: np.ndarray) -> np.ndarray:
    """float32 CIELAB (L in 0..100), light denoising first so sensor noise does not read as texture."""
    smooth = cv2.GaussianBlur(rgb, (3, 3), 0)
    return cv2.cvtColor(smooth.astype(np.float32) / 255.0, cv2.COLOR_RGB2LAB)


def noise_threshold(residuals: np.ndarray, k: float = 4.0) -> float:
    """Distance above which a pixel is not background: k times the median background residual.

    The median stays put while up to half the samples belong to something else (an
    object touching the border, a neighbour inside a box's ring); for Gaussian sensor
    noise k=4 is about six standard deviations."""
    if residuals.size == 0:
        return MIN_CONTRAST
    return max(MIN_CONTRAST, k * float(np.median(residuals)))


def fit_background(lab: np.ndarray, border: int) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``colour = a + b*x + c*y`` per channel to the border strip, robustly.

    A plane absorbs the light fall-off of studio shots; two reweighting passes drop
    border pixels that belong to an object touching the edge. Returns the predicted
    background (H x W x 3) and the inlier residuals of the border."""
    h, w = lab.shape[:2]
    sel = np.zeros((h, w), bool)
    sel[:border], sel[-border:], sel[:, :border], sel[:, -border:] = True, True, True, True
    ys, xs = np.nonzero(sel)
    step = max(1, ys.size // 20000)
    ys, xs = ys[::step], xs[::step]
    vals = lab[ys, xs].astype(np.float64)
    design = np.stack([np.ones_like(xs, dtype=np.float64), xs / w, ys / h], axis=1)
    keep = np.ones(len(vals), bool)
    coef = np.zeros((3, 3))
    for _ in range(3):
        coef, *_ = np.linalg.lstsq(design[keep], vals[keep], rcond=None)
        res = np.linalg.norm(design @ coef - vals, axis=1)
        cut = max(np.percentile(res, 60) * 2.0, 1.0)
        keep = res <= cut
        if keep.sum() < 10:
            keep = res <= np.percentile(res, 50)
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32) / w, np.arange(h, dtype=np.float32) / h)
    bg = coef[0][None, None, :] + gx[..., None] * coef[1][None, None, :] + gy[..., None] * coef[2][None, None, :]
    return bg.astype(np.float32), res[keep]


def soft_ramp(x: float, lo: float, hi: float) -> float:
    if hi <= lo:
        return 1.0 if x >= hi else 0.0
    return float(np.clip((x - lo) / (hi - lo), 0.0, 1.0))


# --------------------------------------------------------------------------- box evidence


class BoxEvidence:
    """What the neighbourhood of one box says, on the work-size image.

    ``d``/``fg`` cover the box plus its ring (``region`` in image pixels, ``inner`` the box
    inside the region); ``ref``/``thr`` are the ring's background colour and threshold."""

    def __init__(self, lab: np.ndarray, box: tuple[int, int, int, int], margin_frac: float) -> None:
        h, w = lab.shape[:2]
        x1, y1, x2, y2 = box
        m = max(3, round(margin_frac * max(x2 - x1, y2 - y1)))
        rx1, ry1, rx2, ry2 = max(0, x1 - m), max(0, y1 - m), min(w, x2 + m), min(h, y2 + m)
        region = lab[ry1:ry2, rx1:rx2]
        ring = np.ones(region.shape[:2], bool)
        ring[y1 - ry1 : y2 - ry1, x1 - rx1 : x2 - rx1] = False
        samples = region[ring]
        if samples.shape[0] < 50:
            # The box reaches the image edge all round: the image's border stands in for the ring.
            b = max(2, round(0.03 * min(h, w)))
            edge = np.ones((h, w), bool)
            edge[b:-b, b:-b] = False
            samples = lab[edge]
        self.ref = np.median(samples, axis=0).astype(np.float32)
        self.thr = noise_threshold(np.linalg.norm(samples - self.ref, axis=1))
        self.region = (rx1, ry1, rx2, ry2)
        self.inner = (x1 - rx1, y1 - ry1, x2 - rx1, y2 - ry1)
        delta = region - self.ref
        self.d = np.linalg.norm(delta, axis=2)
        fg = (self.d > self.thr).astype(np.uint8)
        if min(fg.shape) >= 5:
            fg = cv2.morphologyEx(fg, cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
        self.fg = fg.astype(bool)
        # Cast shadows on a studio floor: darker, same hue, not much darker.
        chroma = np.linalg.norm(delta[..., 1:], axis=2)
        ratio = region[..., 0] / max(float(self.ref[0]), 1e-3)
        self.shadow = (chroma < max(self.thr, 8.0)) & (ratio > 0.6) & (ratio < 1.0)

    def box_d(self) -> np.ndarray:
        ix1, iy1, ix2, iy2 = self.inner
        return self.d[iy1:iy2, ix1:ix2]

    def box_fg(self) -> np.ndarray:
        ix1, iy1, ix2, iy2 = self.inner
        return self.fg[iy1:iy2, ix1:ix2]

    def cut_fraction(self) -> float:
        """How much of the box's worst side has foreground running on past it.

        Per side, a strip just outside the box; a position along the side counts when most
        of its strip is (non-shadow) foreground. A box drawn tight or a few pixels inside
        the object's outline does not count as cutting it."""
        ix1, iy1, ix2, iy2 = self.inner
        solid = self.fg & ~self.shadow
        width = max(3, round(0.04 * max(ix2 - ix1, iy2 - iy1)))
        strips = []
        if ix1 > 0:
            strips.append(solid[iy1:iy2, max(0, ix1 - width) : ix1].mean(axis=1))
        if ix2 < solid.shape[1]:
            strips.append(solid[iy1:iy2, ix2 : ix2 + width].mean(axis=1))
        if iy1 > 0:
            strips.append(solid[max(0, iy1 - width) : iy1, ix1:ix2].mean(axis=0))
        if iy2 < solid.shape[0]:
            strips.append(solid[iy2 : iy2 + width, ix1:ix2].mean(axis=0))
        return max((float((s > 0.5).mean()) for s in strips if s.size), default=0.0)
