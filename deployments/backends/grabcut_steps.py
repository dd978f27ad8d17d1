"""The two steps every GrabCut here goes through, and nothing else: cut a box's neighbourhood out at a
work size and map the box into it (``crop_around``, ``BoxCrop``, and back again: ``BoxCrop.paste``),
and run GrabCut on seeded labels there, reproducibly (``run_grabcut``).

Their callers (the classical segmenter, its prompted GrabCut, and the quality gate's recuts) seed the
labels each its own way and keep their own fallback for when GrabCut cannot run; what the steps do
is theirs to share, so that a crop maps the same way and a cut repeats, wherever it is made.

Reproducible: GrabCut starts its colour models with k-means, whose first centres come from OpenCV's
RNG. Unseeded, the same picture cut twice in one process can give two masks, depending on what else
drew from that RNG before (another cut, any OpenCV call that uses it). ``run_grabcut`` seeds it first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import cv2
import numpy as np

from .background import resize_max

log = logging.getLogger(__name__)

GRABCUT_SEED = 17  # the classical backend's: any constant will do, the point is that it is one
MIN_MARGIN_PX = 4  # the least margin around a box, image pixels (a box's ring needs a few)

Box = tuple[int, int, int, int]


@dataclass(frozen=True, eq=False)
class BoxCrop:
    """A box's neighbourhood at a work size: ``rect`` the neighbourhood in image pixels (``rx1, ry1,
    rx2, ry2``, the far sides exclusive), ``crop`` its pixels scaled by ``s`` (at most 1), ``box`` the
    box in ``crop``'s pixels (``bx1, by1, bx2, by2``, at least one pixel each way, inside ``crop``),
    ``full_shape`` the image's ``(height, width)``."""

    rect: Box
    crop: np.ndarray
    s: float
    box: Box
    full_shape: tuple[int, int]

    def region(self, full: np.ndarray) -> np.ndarray:
        """``full`` (anything the image's size) on the neighbourhood, at image scale."""
        rx1, ry1, rx2, ry2 = self.rect
        return full[ry1:ry2, rx1:rx2]

    def to_work(self, mask: np.ndarray, interpolation: int | None = None) -> np.ndarray:
        """``mask`` (image size) on the neighbourhood at the work size, bool: a pixel is set when the
        resized mask is anywhere above zero there. ``interpolation`` defaults to area averaging when
        the crop was shrunk and nearest neighbour when not."""
        if interpolation is None:
            interpolation = cv2.INTER_AREA if self.s < 1 else cv2.INTER_NEAREST
        ch, cw = self.crop.shape[:2]
        return cv2.resize(self.region(mask).astype(np.uint8), (cw, ch), interpolation=interpolation) > 0

    def to_work_xy(self, x: float, y: float) -> tuple[int, int]:
        """The work pixel an image point falls on (it may lie outside the crop)."""
        rx1, ry1 = self.rect[:2]
        return round((x - rx1) * self.s), round((y - ry1) * self.s)

    def paste(self, small: np.ndarray) -> np.ndarray:
        """A work-size mask (bool, ``crop``'s size) at image size: scaled back (bilinear, then at least
        half) when the crop was shrunk, on a background of False."""
        rx1, ry1, rx2, ry2 = self.rect
        if self.s < 1.0:
            up = cv2.resize(small.astype(np.float32), (rx2 - rx1, ry2 - ry1), interpolation=cv2.INTER_LINEAR)
            small = up >= 0.5
        full = np.zeros(self.full_shape, bool)
        full[ry1:ry2, rx1:rx2] = small
        return full


def grown(box: Box, frac: float, width: int, height: int) -> Box:
    """``box`` grown by ``frac`` of its width and height on every side, truncated to whole pixels and
    clipped to a ``width`` x ``height`` image."""
    x1, y1, x2, y2 = box
    gw, gh = frac * (x2 - x1), frac * (y2 - y1)
    return int(max(0, x1 - gw)), int(max(0, y1 - gh)), int(min(width, x2 + gw)), int(min(height, y2 + gh))


def crop_around(
    image: np.ndarray, bounds: Box, *, margin_frac: float, work_px: int, min_margin: int = MIN_MARGIN_PX
) -> BoxCrop:
    """The neighbourhood of ``bounds`` (integer image pixels, x2/y2 exclusive) in ``image``: the box
    with a margin of ``margin_frac`` of its long side (at least ``min_margin`` pixels) on every side,
    clipped to the image, shrunk so its long side is at most ``work_px``."""
    oh, ow = image.shape[:2]
    x1, y1, x2, y2 = bounds
    m = max(min_margin, round(margin_frac * max(x2 - x1, y2 - y1)))
    rx1, ry1, rx2, ry2 = max(0, x1 - m), max(0, y1 - m), min(ow, x2 + m), min(oh, y2 + m)
    crop, s = resize_max(image[ry1:ry2, rx1:rx2], work_px)
    ch, cw = crop.shape[:2]
    bx1, by1 = round((x1 - rx1) * s), round((y1 - ry1) * s)
    bx2, by2 = min(cw, max(bx1 + 1, round((x2 - rx1) * s))), min(ch, max(by1 + 1, round((y2 - ry1) * s)))
    return BoxCrop((rx1, ry1, rx2, ry2), crop, s, (bx1, by1, bx2, by2), (oh, ow))


def run_grabcut(
    crop_rgb: np.ndarray,
    gc: np.ndarray,
    iterations: int,
    *,
    seed: int = GRABCUT_SEED,
    rect: Box | None = None,
) -> np.ndarray | None:
    """GrabCut's foreground (``GC_FGD`` or ``GC_PR_FGD``, bool) on ``crop_rgb`` (RGB uint8), started
    from the labels in ``gc`` (uint8, ``crop_rgb``'s size; updated in place, as OpenCV does) or, with
    ``rect`` (``x, y, width, height``), from GrabCut's own rectangle start; OpenCV's RNG seeded with
    ``seed`` first. None when OpenCV refuses (one label class only, a mismatched mask): the caller
    falls back its own way."""
    bgd, fgd = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
    try:
        bgr = cv2.cvtColor(np.ascontiguousarray(crop_rgb), cv2.COLOR_RGB2BGR)
        # OpenCV's RNG is per thread (cv::theRNG), and GrabCut draws from the calling thread's: seeded
        # here, in this thread, right before the call, the cut repeats whatever ran before it.
        cv2.setRNGSeed(seed)
        if rect is None:
            cv2.grabCut(bgr, gc, None, bgd, fgd, iterations, cv2.GC_INIT_WITH_MASK)  # type: ignore[call-overload]  # rect: unused with a mask
        else:
            cv2.grabCut(bgr, gc, rect, bgd, fgd, iterations, cv2.GC_INIT_WITH_RECT)
    except cv2.error as exc:
        log.debug("grabcut refused its input (%s, mask %s): %s", crop_rgb.shape, gc.shape, exc)
        return None
    return (gc == cv2.GC_FGD) | (gc == cv2.GC_PR_FGD)
