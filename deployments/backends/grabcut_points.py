"""GrabCut seeded by a box, a reviewer's clicks and optionally an earlier mask: the classical
backend's prompted segmentation, and the edge-aware refinement of ``REFINE_SUBJECT``.

Seeds, on the box's neighbourhood scaled to ``work_size``: outside the prompt's bounds (the
box grown to hold the positive points) is sure background; inside, one of

- ``evidence``: pixels that differ from the ring around the box are probable foreground,
  the rest probable background (as ``ClassicalSegmenter`` seeds its box);
- ``rect``: the whole box probable foreground (GrabCut's own rectangle start);
- ``prior``: an earlier mask probable foreground, the rest of the box probable background;

then, for each click, the part of the box connected to it in much its colour (within
``REGION_TOL`` Delta E) becomes probable foreground (a positive click) or probable background
(a negative one), and a disc around it sure foreground or sure background, drawn in the
order given so a later click wins where two overlap. A click's region matters: a disc alone
is too few pixels to teach GrabCut's colour models what the reviewer meant. GrabCut then
moves the outline onto the image's edges (``grabcut_steps``: the crop, and a seeded cut that repeats).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np

from .background import BoxEvidence, to_lab
from .grabcut_steps import crop_around, run_grabcut
from .prompts import Point, clean_prompted_mask, prompt_bounds

log = logging.getLogger(__name__)

Seeding = Literal["evidence", "rect", "prior"]
REGION_TOL = 12.0  # Delta E: how far a click's colour region reaches


@dataclass(frozen=True)
class Variant:
    """One way to seed GrabCut; ``radius_frac``: the click discs' radius as a fraction of the
    box's diagonal (at least 2 work pixels)."""

    name: str
    seeding: Seeding
    radius_frac: float
    iterations: int


# The default first, then alternatives that fail differently: the plain rectangle start (no
# trust in the ring's colour), and wider click discs with more iterations.
VARIANTS = (
    Variant("grabcut-evidence", "evidence", 0.015, 4),
    Variant("grabcut-rect", "rect", 0.015, 5),
    Variant("grabcut-wide-discs", "evidence", 0.04, 8),
)


def grabcut_prompt(
    image: np.ndarray,
    bbox: Any,
    points: list[Point],
    variant: Variant,
    *,
    prior: np.ndarray | None = None,
    work_size: int = 320,
    margin_frac: float = 0.1,
    max_hole_frac: float = 0.1,
) -> np.ndarray:
    """The subject's mask (bool, the image's size) for one seeding ``variant``; ``prior`` (bool,
    image size) is the earlier mask the ``prior`` seeding starts from."""
    oh, ow = image.shape[:2]
    bounds = prompt_bounds(bbox, points, ow, oh)
    near = crop_around(image, bounds, margin_frac=margin_frac, work_px=work_size)
    crop = near.crop
    ch, cw = crop.shape[:2]
    bx1, by1, bx2, by2 = near.box

    gc = np.full((ch, cw), cv2.GC_BGD, np.uint8)
    if variant.seeding == "prior":
        if prior is None:
            raise ValueError("the prior seeding needs a prior mask")
        small_prior = near.to_work(prior, cv2.INTER_NEAREST)
        inside = np.where(small_prior[by1:by2, bx1:bx2], cv2.GC_PR_FGD, cv2.GC_PR_BGD)
    elif variant.seeding == "evidence":
        ev = BoxEvidence(to_lab(crop), near.box, margin_frac)
        inside = np.where(ev.box_d() > 0.5 * ev.thr, cv2.GC_PR_FGD, cv2.GC_PR_BGD)
    else:
        inside = np.full((by2 - by1, bx2 - bx1), cv2.GC_PR_FGD)
    if (inside == cv2.GC_PR_FGD).mean() < 0.05:
        inside[:] = cv2.GC_PR_FGD  # the seeding explains nothing: GrabCut's rectangle start
    gc[by1:by2, bx1:bx2] = inside
    if not (gc == cv2.GC_BGD).any():
        # The box is the whole crop: let the crop's frame stand for the background.
        gc[0, :] = gc[-1, :] = cv2.GC_PR_BGD
        gc[:, 0] = gc[:, -1] = cv2.GC_PR_BGD
    lab = to_lab(crop)
    clicks = [(near.to_work_xy(x, y), pos) for x, y, pos in points]
    in_box = np.zeros((ch, cw), bool)
    in_box[by1:by2, bx1:bx2] = True
    regions = {True: np.zeros((ch, cw), bool), False: np.zeros((ch, cw), bool)}
    for (cx, cy), positive in clicks:
        if 0 <= cx < cw and 0 <= cy < ch:
            regions[positive] |= _colour_region(lab, cx, cy) & in_box
    # Where a positive and a negative click's regions overlap, colour cannot tell them apart:
    # the box's own seeding stays there.
    gc[regions[True] & ~regions[False]] = cv2.GC_PR_FGD
    gc[regions[False] & ~regions[True]] = cv2.GC_PR_BGD
    radius = max(2, round(variant.radius_frac * math.hypot(bx2 - bx1, by2 - by1)))
    for centre, positive in clicks:
        cv2.circle(gc, centre, radius, int(cv2.GC_FGD if positive else cv2.GC_BGD), -1)

    full = near.paste(_run_grabcut(crop, gc, variant.iterations))
    return clean_prompted_mask(full, points, bounds, max_hole_frac)


def _colour_region(lab: np.ndarray, x: int, y: int, tol: float = REGION_TOL) -> np.ndarray:
    """The pixels connected to ``(x, y)`` whose colour lies within ``tol`` Delta E of the click's
    (the click's 3x3 median): the part of the picture a click points at."""
    y0, y1, x0, x1 = max(0, y - 1), y + 2, max(0, x - 1), x + 2
    ref = np.median(lab[y0:y1, x0:x1].reshape(-1, 3), axis=0)
    near = (np.linalg.norm(lab - ref, axis=2) <= tol).astype(np.uint8)
    if not near[y, x]:
        return np.zeros(near.shape, bool)
    _, labels = cv2.connectedComponents(near, connectivity=4)
    return np.asarray(labels == labels[y, x])


def _run_grabcut(crop: np.ndarray, gc: np.ndarray, iterations: int) -> np.ndarray:
    """GrabCut's foreground; the seeds themselves when it cannot run (one label class only, or
    OpenCV refuses)."""
    seeds = (gc == cv2.GC_FGD) | (gc == cv2.GC_PR_FGD)
    if not (seeds.any() and ((gc == cv2.GC_BGD) | (gc == cv2.GC_PR_BGD)).any()):
        return seeds
    fg = run_grabcut(crop, gc, iterations)
    if fg is None:
        log.debug("prompted grabcut failed, using its seeds")
        return seeds
    return fg


def prompted_candidates(
    image: np.ndarray, bbox: Any, points: list[Point], *, multimask: bool = False, **kw: Any
) -> list[dict[str, Any]]:
    """``segment_prompt``'s candidates: the default seeding, and with ``multimask`` the other
    variants too (always all of them, even when two agree), in ``VARIANTS`` order. GrabCut has no calibrated score:
    ``predicted_iou`` and ``stability`` are None and the order is the seeding's prior, not a
    measurement; ``method`` names the variant."""
    out: list[dict[str, Any]] = []
    for variant in VARIANTS if multimask else VARIANTS[:1]:
        mask = grabcut_prompt(image, bbox, points, variant, **kw)
        out.append({"mask": mask, "predicted_iou": None, "stability": None, "method": variant.name})
    return out
