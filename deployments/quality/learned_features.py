"""The quality gate's features beyond gate-v1's, and how a learned score's verdict is said
(SPEC.md §13). First measured for the retired gate-v2 (its calibration: ``gate.py``'s docstring and
git history); now recorded under every learned policy (gate-v5, a file ``hitl learn gate`` wrote,
which may read them), and ``explain`` words the verdict of any learned score (``Score``).

Features, measured without ground truth on the box, a margin around it and the mask
(``gate.score_mask`` passes its own CIELAB crop, outline and gradient, so the extra cost is one tiny
GrabCut and a few array passes, about 0.8x gate-v1's own time):

- ``recut_iou``: self-consistency of the cut, as SAM's stability score is for SAM. A second, cheap
  segmentation of the same subject under a perturbation (GrabCut's plain rectangle start on the box
  grown by 3 %, 1 iteration, the neighbourhood shrunk to 32 px), compared with the mask at that size:
  a mask the picture supports comes back much the same; one that hangs on a lucky seeding does not.
- ``solidity``: the mask's area (pixels) over its convex hull's (the polygon through the outline's
  pixel centres, so a convex mask scores a little over 1).
- ``edge_share``: the share of the outline (the box's border left out) on a clear image edge (a colour
  gradient over twice the box's mean).
- A background model fitted to the ring around the box (a colour plane in CIELAB, robust to what else
  stands there, so a studio gradient is still background; on every other pixel each way), its noise
  threshold ``bg_noise`` (Delta E) and its soft foreground map ``d`` (distance from the plane over the
  threshold), with cast shadows (the background's hue, darker) counted as background: ``bg_like``, the
  share of the mask in blobs that look like background or shadow (a filled-in hole, the floor between
  a chair's legs); ``fg_iou_loose`` and ``fg_iou_strict``, the mask's IoU with what stands out at half
  and at twice the threshold; ``fg_stability``, the IoU of those two maps (how clearly the subject
  stands out at all); ``outline_fit``, the share of the outline with the subject's side inside and
  the background's side outside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

import cv2
import numpy as np

from ..backends.grabcut_steps import crop_around, grown, run_grabcut

RECUT_GROW = 0.03  # the perturbation: the box grown by this share of its size on every side
RECUT_MARGIN = 0.1  # the recut's neighbourhood: the grown box with this share of its long side around it
RECUT_WORK_PX = 32  # the recut's neighbourhood, long side
RECUT_ITERATIONS = 1
RECUT_SEED = 21  # OpenCV's GrabCut draws its k-means start from a global RNG: seeded, a verdict repeats
RING_STEP = 2  # the background model's grid: every other pixel each way (a quarter of the work)
RING_BLUR = 3  # its smoothing window, grid pixels
RING_NEAR = 5  # how near the outline the subject's and the background's sides are looked for, grid pixels


class Score(Protocol):
    """What ``gate.judge`` and ``explain`` need of a learned score (gate-v5's ``NetScore``, a learned file's
    ``gate_file.FileScore``)."""

    @property
    def threshold(self) -> float: ...
    @property
    def words(self) -> Mapping[str, tuple[str, str]]: ...
    @property
    def features(self) -> tuple[str, ...]: ...
    def score(self, scores: Mapping[str, float]) -> float: ...
    def probability(self, scores: Mapping[str, float]) -> float: ...
    def contributions(self, scores: Mapping[str, float]) -> dict[str, float]: ...


# Words for what pushes a mask's score up, as ``(phrase, unit)``, the phrase taking the value formatted by
# the unit; every feature's bad side is the one the retired gate-v2's score rose towards.
_WORDS: dict[str, tuple[str, str]] = {
    "recut_iou": ("a second, coarser cut of the same box overlaps it by only {}", "pct"),
    "fg_iou_loose": ("it overlaps what stands out from the background by only {}", "pct"),
    "fg_iou_strict": ("it overlaps what clearly stands out from the background by only {}", "pct"),
    "fg_stability": ("what stands out from the background changes with how much it must ({} stable)", "pct"),
    "bg_like": ("{} of it looks like the background or its shadow", "pct"),
    "outline_fit": ("only {} of its outline separates subject from background", "pct"),
    "bg_noise": ("the background around the box is busy (noise {} Delta E)", "num"),
    "edge_share": ("only {} of its outline lies on a clear edge", "pct"),
    "solidity": ("it is fully convex, as a filled-in box is (solidity {})", "num"),
    "contrast": ("the colours barely change across its outline (contrast {})", "num"),
    "edge_alignment": ("its outline does not follow the picture's edges (alignment {})", "num"),
    "box_gap": ("it stops {} of the box short of one side", "pct"),
    "cut_off": ("it runs into the box's edge where the subject goes on ({} of a side)", "pct"),
    "bg_closer": ("{} of it is nearer the background's colour than the subject's rim", "pct"),
    "fill": ("it covers only {} of the box", "pct"),
    "box_agreement": ("its extent matches the box's by only {}", "pct"),
    "edge_touch": ("it runs along {} of the box's border", "pct"),
    "holes": ("its holes are {} of it", "pct"),
}
_UNITS = {"pct": "{:.0f}%", "int": "{:.0f}"}
SAY_FROM = 0.2  # a feature's step must add this much to the log-odds to be named in a reason


def explain(learned: Score, scores: Mapping[str, float], top: int = 2) -> str:
    """One plain sentence for a failing learned score: the odds it gives, and the (at most ``top``)
    features that pushed it up the most."""
    parts = sorted(learned.contributions(scores).items(), key=lambda kv: -kv[1])
    said = []
    for key, weight in parts[:top]:
        if weight < SAY_FROM:
            break
        phrase, unit = learned.words.get(key) or _WORDS.get(key, (key + " {}", "num"))
        value = scores[key]
        said.append(phrase.format(_UNITS.get(unit, "{:.2f}").format(value * (100 if unit == "pct" else 1))))
    why = f": {'; '.join(said)}" if said else ""
    return (
        f"the learned score rates this mask likely wrong ({100 * learned.probability(scores):.0f}% on the "
        f"labelled benchmark's odds, limit {100 / (1 + math.exp(-learned.threshold)):.0f}%){why}"
    )


def extra_features(
    image: np.ndarray,
    mask: np.ndarray,
    image_box: tuple[int, int, int, int],
    crop: np.ndarray,
    lab: np.ndarray,
    box: tuple[int, int, int, int],
    outline: np.ndarray,
    grad: np.ndarray,
) -> dict[str, float]:
    """``gate-v2``'s features (module docstring). ``crop``/``lab``: the mask and the CIELAB picture on
    ``gate.score_mask``'s neighbourhood of the box, ``box`` the box in it, ``outline`` the mask's
    outline there without the box's border, ``grad`` the colour gradient; ``image_box`` the box in
    the image."""
    bx1, by1, bx2, by2 = box
    area = max(1, int(crop.sum()))
    inbox = np.zeros(crop.shape, bool)
    inbox[by1:by2, bx1:bx2] = True
    out = {"recut_iou": recut_iou(image, mask, image_box), "solidity": _solidity(crop, area)}
    in_box = float(grad[by1:by2, bx1:bx2].mean())
    out["edge_share"] = float((grad[outline] > 2 * in_box).mean()) if outline.any() else 0.0
    out.update(_ring_model(lab, crop, inbox, outline))
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.count_nonzero(a | b)
    return np.count_nonzero(a & b) / union if union else 1.0


def recut_iou(
    image: np.ndarray,
    mask: np.ndarray,
    image_box: tuple[int, int, int, int],
    *,
    work_px: int = RECUT_WORK_PX,
    iterations: int = RECUT_ITERATIONS,
    seed: int = RECUT_SEED,
) -> float:
    """IoU of ``mask`` with a second, cheap GrabCut of its box (see ``recut_iou`` above), both at the
    recut's size (``work_px``, the long side; gate-v3 runs another at its own size, iterations, seed)."""
    h, w = mask.shape
    near = crop_around(image, grown(image_box, RECUT_GROW, w, h), margin_frac=RECUT_MARGIN, work_px=work_px)
    theirs = near.to_work(mask)
    bx1, by1, bx2, by2 = near.box
    gc = np.full(near.crop.shape[:2], cv2.GC_BGD, np.uint8)
    gc[by1:by2, bx1:bx2] = cv2.GC_PR_FGD
    if not (gc == cv2.GC_BGD).any():  # the box is the whole neighbourhood: its frame stands for the background
        gc[0, :] = gc[-1, :] = cv2.GC_PR_BGD
        gc[:, 0] = gc[:, -1] = cv2.GC_PR_BGD
    cut = gc == cv2.GC_PR_FGD  # one label class only: GrabCut cannot run, its start stands
    if cut.any() and ((gc == cv2.GC_PR_BGD) | (gc == cv2.GC_BGD)).any():
        recut = run_grabcut(near.crop, gc, iterations, seed=seed)
        cut = np.zeros(gc.shape, bool) if recut is None else recut  # None: OpenCV refused, nothing recut
    return round(_iou(cut, theirs), 4)


def _solidity(crop: np.ndarray, area: int) -> float:
    contours, _ = cv2.findContours(crop.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    if not contours:
        return 0.0
    hull = cv2.contourArea(cv2.convexHull(max(contours, key=cv2.contourArea)))
    return float(area / max(1.0, hull))


def _blob_share(sel: np.ndarray, area: int, min_share: float = 0.01) -> float:
    """The share of ``area`` in 8-connected blobs of ``sel`` of at least ``min_share`` of it."""
    _, _, stats, _ = cv2.connectedComponentsWithStats(sel.astype(np.uint8), connectivity=8)
    blobs = stats[1:, cv2.CC_STAT_AREA]
    return float(blobs[blobs >= min_share * area].sum() / area)


_NEUTRAL = {"bg_like": 0.0, "fg_iou_loose": 1.0, "fg_iou_strict": 1.0, "fg_stability": 1.0}


def fit_plane(lab: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> tuple[np.ndarray, float]:
    """A colour plane in CIELAB fitted to ``lab``'s pixels at ``ys``/``xs`` (at most ~3000 of them),
    robust to what else stands there, over the whole of ``lab``; and its noise threshold (Delta E)."""
    ch, cw = lab.shape[:2]
    step = max(1, ys.size // 3000)
    ys, xs = ys[::step], xs[::step]
    vals = lab[ys, xs].astype(np.float64)
    design = np.stack([np.ones(xs.size), xs / cw, ys / ch], axis=1)
    keep = np.ones(vals.shape[0], bool)
    for _ in range(3):  # drop what else stands in the ring (another subject, a shadow) and refit
        a = design[keep]
        coef = np.linalg.lstsq(a.T @ a, a.T @ vals[keep], rcond=None)[0]  # the normal equations: 3 x 3
        diff = design @ coef - vals
        res = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        keep = res <= max(float(np.percentile(res, 60)) * 2.0, 1.0)
    thr = max(6.0, 4.0 * float(np.median(res[keep])))
    c = coef.astype(np.float32)
    across = (np.arange(cw, dtype=np.float32) / cw)[None, :, None]
    down = (np.arange(ch, dtype=np.float32) / ch)[:, None, None]
    return c[0] + across * c[1] + down * c[2], thr


def _ring_model(lab: np.ndarray, crop: np.ndarray, inbox: np.ndarray, outline: np.ndarray) -> dict[str, float]:
    """The background plane's features (module docstring), on every ``RING_STEP``-th pixel each way."""
    oy, ox = np.nonzero(outline)
    lab, crop, inbox = lab[::RING_STEP, ::RING_STEP], crop[::RING_STEP, ::RING_STEP], inbox[::RING_STEP, ::RING_STEP]
    area = max(1, int(np.count_nonzero(crop)))
    ys, xs = np.nonzero(~inbox & ~crop)
    if ys.size < 20:  # the box fills the picture: no background to learn from
        return {**_NEUTRAL, "bg_noise": 6.0, "outline_fit": 1.0}
    plane, thr = fit_plane(lab, ys, xs)
    sq = np.square(lab - plane)
    chroma2 = sq[..., 1] + sq[..., 2]
    d = cv2.blur(np.sqrt(sq[..., 0] + chroma2), (RING_BLUR, RING_BLUR)) / thr
    light, floor = lab[..., 0], plane[..., 0]
    shadow = (chroma2 < max(thr, 8.0) ** 2) & (light > 0.5 * floor) & (light < floor)
    shadow = cv2.blur(shadow.view(np.uint8), (RING_BLUR, RING_BLUR)) > 0  # a majority of the window
    background = (d < 1) | shadow
    mine = crop & inbox
    loose, strict = inbox & (d > 0.5) & ~shadow, inbox & (d > 2) & ~shadow
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (RING_NEAR, RING_NEAR))
    near_bg = cv2.dilate((~crop & background).view(np.uint8), kernel).view(bool)
    near_fg = cv2.dilate((crop & (d > 1) & ~shadow).view(np.uint8), kernel).view(bool)
    return {
        "bg_like": _blob_share(crop & background, area),
        "fg_iou_loose": _iou(loose, mine),
        "fg_iou_strict": _iou(strict, mine),
        "fg_stability": _iou(loose, strict),
        "bg_noise": thr,
        "outline_fit": float((near_bg & near_fg)[oy // RING_STEP, ox // RING_STEP].mean()) if oy.size else 1.0,
    }


EXTRA_FEATURES: tuple[str, ...] = ("recut_iou", "solidity", "edge_share", "bg_like", "fg_iou_loose", "fg_iou_strict")
EXTRA_FEATURES += ("fg_stability", "bg_noise", "outline_fit")
