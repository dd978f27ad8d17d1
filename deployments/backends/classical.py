"""Weight-free OpenCV backends for product photos on plain or studio backgrounds.

The embedded default when no checkpoint is configured. All three share one idea: the
background is what the picture's border (or the ring just outside a box) looks like,
measured in CIELAB so distances are perceptual (Delta E 76), and an object is a region
that differs from it by clearly more than the background's own noise.

- ``ClassicalDetector``: a background colour plane fitted robustly to the image border,
  difference map, morphology, connected components, one scored box per blob.
- ``ClassicalValidator``: does a box enclose a segmentable object? Compares the inside of
  the box with the ring around it: how much of it stands out, by how much, and whether
  the box cuts through the object.
- ``ClassicalSegmenter``: GrabCut seeded by the box (plus the ring's background model), a
  threshold mask when GrabCut gives up, then largest component and hole filling.

Every GrabCut here (the scene proposals' too) runs through ``grabcut_steps.run_grabcut``, which
seeds OpenCV's RNG first: the same picture gives the same boxes and masks whatever ran before.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import cv2
import numpy as np

from .background import BoxEvidence, fit_background, noise_threshold, resize_max, soft_ramp, to_lab
from .base import box_problem, check_image, int_box, invalid_result, register
from .grabcut_points import prompted_candidates
from .grabcut_steps import crop_around, run_grabcut
from .naming import NAMING_THRESHOLD, best_match, check_threshold
from .postprocess import clean_mask, feather
from .prompts import check_prompt

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- detector


@register("detector", "classical")
class ClassicalDetector:
    """Boxes around whatever stands out from the border's background colour.

    ``score`` in [0, 1] multiplies a contrast term (mean Delta E of the blob over the noise
    threshold), a shape term (solidity: products are compact, shadows and clutter are
    not) and a size term; blobs that span the frame edge to edge are background, not
    subjects, and are dropped. When the border itself is cluttered (its noise threshold
    above ``clutter_threshold`` Delta E) the photo is a scene, and GrabCut from an inset
    frame proposes the subjects instead."""

    name = "classical"

    def __init__(
        self,
        max_detections: int = 10,
        min_score: float = 0.2,
        min_area_frac: float = 0.002,
        work_size: int = 512,
        border_frac: float = 0.03,
        clutter_threshold: float = 25.0,
        label: str = "object",
    ) -> None:
        self.clutter_threshold = float(clutter_threshold)
        self.max_detections = int(max_detections)
        self.min_score = float(min_score)
        self.min_area_frac = float(min_area_frac)
        self.work_size = int(work_size)
        self.border_frac = float(border_frac)
        self.label = label

    def residual(self, image: np.ndarray) -> tuple[np.ndarray, float, float]:
        """The work-size picture less its background plane fitted to the border (CIELAB, per
        channel), the background's noise threshold (Delta E) and the scale."""
        small, scale = resize_max(check_image(image), self.work_size)
        lab = to_lab(small)
        h, w = lab.shape[:2]
        border = max(2, round(self.border_frac * min(h, w)))
        bg, residuals = fit_background(lab, border)
        return lab - bg, noise_threshold(residuals, 5.0), scale

    def foreground(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
        """The work-size difference map, its binary foreground, the threshold and the scale."""
        d, thr, scale = self.residual(image)
        return (*self._foreground_of(d, thr), thr, scale)

    def _foreground_of(self, d: np.ndarray, thr: float) -> tuple[np.ndarray, np.ndarray]:
        h, w = d.shape[:2]
        diff = np.linalg.norm(d, axis=2)
        fg = (diff > thr).astype(np.uint8)
        fg = cv2.morphologyEx(fg, cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
        k = max(3, round(0.012 * math.hypot(h, w))) | 1
        fg = cv2.morphologyEx(fg, cv2.MORPH_CLOSE, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (k, k)))
        return diff, fg

    def detect(self, image: np.ndarray, image_sha: str) -> list[dict[str, Any]]:
        """Scored boxes, each with its ``evidence`` (``evidence_of``: what the picture says about the
        box beyond its score, which the box policy reads)."""
        d, thr, scale = self.residual(image)
        diff, fg = self._foreground_of(d, thr)
        if thr > self.clutter_threshold:
            # The border is no plain background (a scene, not a studio shot).
            candidates = self._grabcut_proposals(image)
        else:
            candidates = self._blob_proposals(diff, fg, thr, scale)
        merged = _merge_boxes(candidates)
        oh, ow = image.shape[:2]
        out: list[dict[str, Any]] = []
        kept: list[list[float]] = []
        for bbox, score in sorted(merged, key=lambda c: -c[1]):
            if score < self.min_score:
                continue
            x1, y1, x2, y2 = bbox
            bbox = [
                round(max(0.0, x1), 2),
                round(max(0.0, y1), 2),
                round(min(float(ow), x2), 2),
                round(min(float(oh), y2), 2),
            ]
            out.append({"bbox": bbox, "label": self.label, "score": round(float(score), 4)})
            kept.append(bbox)
            if len(out) >= self.max_detections:
                break
        for box, seen in zip(out, self.evidence_of(d, thr, scale, kept), strict=True):
            box["evidence"] = seen
        return out

    def evidence(self, image: np.ndarray, bboxes: list[list[float]]) -> list[dict[str, float]]:
        """``evidence_of`` the boxes ``bboxes`` of ``image`` (what ``detect`` reports with each box)."""
        return self.evidence_of(*self.residual(image), bboxes)

    def evidence_of(self, d: np.ndarray, thr: float, scale: float, bboxes: list[list[float]]) -> list[dict[str, float]]:
        """What the picture says about each box beyond its score, for the box policy
        (``statecore.models.DetectorEvidence``, ``statecore.autoapprove.EVIDENCE_FEATURES``), from the
        work-size residual ``d`` (``residual``): ``shrink``, how far the box would move (1 − IoU)
        around its foreground without the shadow-like pixels (darker than the background, its colour
        kept: a chroma change under 0.3 × the drop in L; 0.3 chosen on other images than
        benchmarks/box_evidence.py judges it on), and ``parts``, how many separate pieces of that
        foreground hold at least 4 % of the box (two subjects merged into one box show 2). Measured in
        benchmarks/box_evidence.py (docs/benchmarks.md § What the detector saw)."""
        h, w = d.shape[:2]
        fg = np.linalg.norm(d, axis=2) > thr
        chroma = np.hypot(d[..., 1], d[..., 2])
        shadow = (d[..., 0] < 0) & (chroma < 0.3 * np.abs(d[..., 0]))
        core = cv2.morphologyEx((fg & ~shadow).astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
        out = []
        for bbox in bboxes:
            x1, y1 = max(0, int(bbox[0] * scale)), max(0, int(bbox[1] * scale))
            x2, y2 = min(w, max(x1 + 1, round(bbox[2] * scale))), min(h, max(y1 + 1, round(bbox[3] * scale)))
            inside = core[y1:y2, x1:x2]
            n, _lab, stats, _c = cv2.connectedComponentsWithStats(inside, connectivity=8)
            big = [stats[i] for i in range(1, n) if stats[i][4] >= 0.04 * inside.size]
            if not big:
                out.append({"shrink": 1.0, "parts": 0})
                continue
            cx1 = min(int(s[0]) for s in big)
            cy1 = min(int(s[1]) for s in big)
            cx2 = max(int(s[0] + s[2]) for s in big)
            cy2 = max(int(s[1] + s[3]) for s in big)
            tight = (cx2 - cx1) * (cy2 - cy1) / float(inside.size)  # the core's box inside this box: IoU
            out.append({"shrink": round(1.0 - tight, 4), "parts": len(big)})
        return out

    def _blob_proposals(
        self, diff: np.ndarray, fg: np.ndarray, thr: float, scale: float
    ) -> list[tuple[list[float], float]]:
        h, w = fg.shape
        n, labels, stats, _ = cv2.connectedComponentsWithStats(fg, connectivity=8)
        out: list[tuple[list[float], float]] = []
        min_area = self.min_area_frac * h * w
        for i in range(1, n):
            x, y, bw, bh, area = (int(v) for v in stats[i])
            if area < min_area or area > 0.9 * h * w:
                continue
            sides = (x == 0) + (y == 0) + (x + bw >= w) + (y + bh >= h)
            if sides >= 3:
                continue  # spans the frame: uneven background, not a subject
            comp = labels[y : y + bh, x : x + bw] == i
            contrast = float(diff[y : y + bh, x : x + bw][comp].mean()) / thr
            s_contrast = 1.0 - math.exp(-1.5 * max(0.0, contrast - 1.0))
            s_edge = 1.0 if sides == 0 else (0.85 if sides == 1 else 0.6)
            score = s_contrast * self._shape_area_score(comp, area, min_area) * s_edge
            out.append(([x / scale, y / scale, (x + bw) / scale, (y + bh) / scale], score))
        return out

    def _grabcut_proposals(self, image: np.ndarray) -> list[tuple[list[float], float]]:
        """Subjects of a scene photo: GrabCut from a frame inset by 5%, one box per blob,
        scored by how well the blob's colours separate from the rest (at most 0.8: this
        cue is weaker than a plain background)."""
        small, scale = resize_max(image, 256)
        h, w = small.shape[:2]
        gc = np.zeros((h, w), np.uint8)
        rect = (max(1, round(0.05 * w)), max(1, round(0.05 * h)), round(0.9 * w), round(0.9 * h))
        cut = run_grabcut(small, gc, 3, rect=rect)
        if cut is None:
            log.debug("scene grabcut failed: no proposals")
            return []
        fg = cv2.morphologyEx(cut.astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
        lab = to_lab(small)
        n, labels, stats, _ = cv2.connectedComponentsWithStats(fg, connectivity=8)
        rest = lab[fg == 0]
        if rest.shape[0] < 10:
            return []
        out: list[tuple[list[float], float]] = []
        min_area = self.min_area_frac * h * w
        for i in range(1, n):
            x, y, bw, bh, area = (int(v) for v in stats[i])
            if area < 4 * min_area:
                continue
            comp = labels[y : y + bh, x : x + bw] == i
            inside = lab[y : y + bh, x : x + bw][comp]
            spread = math.sqrt(0.5 * (float(inside.var(axis=0).sum()) + float(rest.var(axis=0).sum()))) + 1e-6
            sep = float(np.linalg.norm(inside.mean(axis=0) - rest.mean(axis=0))) / spread
            score = 0.8 * (1.0 - math.exp(-2.0 * sep)) * self._shape_area_score(comp, area, min_area)
            out.append(([x / scale, y / scale, (x + bw) / scale, (y + bh) / scale], score))
        return out

    @staticmethod
    def _shape_area_score(comp: np.ndarray, area: int, min_area: float) -> float:
        """Products are compact (solidity near 1) and not tiny; shadows and clutter are neither."""
        contours, _ = cv2.findContours(comp.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        if not contours:
            return 0.0
        hull_area = cv2.contourArea(cv2.convexHull(np.concatenate(contours)))
        filled = float(cv2.contourArea(max(contours, key=cv2.contourArea)))
        solidity = min(1.0, max(filled, area) / hull_area) if hull_area > 0 else 0.0
        s_shape = 0.6 + 0.4 * soft_ramp(solidity, 0.3, 0.8)
        s_area = 0.5 + 0.5 * soft_ramp(math.log10(max(area, 1) / min_area), 0.0, 1.5)
        return s_shape * s_area


def _merge_boxes(
    cands: list[tuple[list[float], float]], contain: float = 0.7, iou: float = 0.5
) -> list[tuple[list[float], float]]:
    """Union boxes that are mostly inside one another or overlap a lot (a shoe's sole
    and upper split by a seam are one subject); keep the higher score."""
    boxes = [(list(b), s) for b, s in cands]
    changed = True
    while changed:
        changed = False
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                a, sa = boxes[i]
                b, sb = boxes[j]
                iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
                ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
                inter = iw * ih
                if inter <= 0:
                    continue
                area_a = (a[2] - a[0]) * (a[3] - a[1])
                area_b = (b[2] - b[0]) * (b[3] - b[1])
                if inter / min(area_a, area_b) > contain or inter / (area_a + area_b - inter) > iou:
                    boxes[i] = ([min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])], max(sa, sb))
                    del boxes[j]
                    changed = True
                    break
            if changed:
                break
    return boxes


# --------------------------------------------------------------------------- validator


@register("validator", "classical")
class ClassicalValidator:
    """Scores whether a box encloses one segmentable object.

    ``score = fill * contrast * containment``, each in [0, 1]:
    fill — how much of the box differs from the ring around it (plain background: none);
    contrast — how strongly it differs, in multiples of the ring's own noise;
    containment — foreground running on past a side of the box means the box cuts the
    subject (or lies inside it). ``passed`` is ``score >= threshold``.

    Built for plain and studio backgrounds: where the ring itself is busy (a scene photo)
    it cannot tell a subject from clutter and fails the box, saying so in the reason."""

    name = "classical"
    policy_version = "classical-ring-contrast-v1"

    def __init__(
        self,
        threshold: float = 0.5,
        work_size: int = 512,
        margin_frac: float = 0.15,
        clutter_threshold: float = 25.0,
        naming_threshold: float = NAMING_THRESHOLD,
    ) -> None:
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError("threshold must lie in [0, 1]")
        self.clutter_threshold = float(clutter_threshold)
        self.threshold = float(threshold)
        self.work_size = int(work_size)
        self.margin_frac = float(margin_frac)
        self.naming_threshold = check_threshold(naming_threshold)
        self.proposer = ClassicalDetector(min_score=0.0, max_detections=5, clutter_threshold=clutter_threshold)

    def name_boxes(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The weight-free backends know one name, the detector's label ("object"): they cannot tell a
        shoe from a bag. A box is named when the classical detector, run on the box and a margin around
        it (half the box's size each side), proposes that box itself; the confidence is the proposal's
        score (contrast x shape x size, in [0, 1]: a score, not a calibrated probability) scaled down
        when it matches the box poorly (``naming.best_match``). A box over plain background, or one
        that cuts a subject, stays unnamed; so does most of a busy scene."""
        oh, ow = check_image(image).shape[:2]
        out = []
        for b in boxes:
            label, score = None, 0.0
            if box_problem(b.get("bbox"), ow, oh) is None:
                x1, y1, x2, y2 = int_box(b["bbox"], ow, oh)
                mx, my = max(4, (x2 - x1) // 2), max(4, (y2 - y1) // 2)
                cx1, cy1, cx2, cy2 = max(0, x1 - mx), max(0, y1 - my), min(ow, x2 + mx), min(oh, y2 + my)
                proposals = self.proposer.detect(image[cy1:cy2, cx1:cx2], image_sha)
                label, score = best_match(proposals, [x1 - cx1, y1 - cy1, x2 - cx1, y2 - cy1])
            out.append({"box_id": b["box_id"], "label": label, "score": round(score, 4)})
        return out

    def score_box(
        self, lab: np.ndarray, box: tuple[int, int, int, int], global_fg: np.ndarray | None = None
    ) -> tuple[float, str | None]:
        """Score one box (work-size pixel bounds); ``global_fg`` is the image's foreground
        against its border background, used only to word the reason of a failed box."""
        ev = BoxEvidence(lab, box, self.margin_frac)
        fg, d = ev.box_fg(), ev.box_d()
        fill = float(fg.mean())
        contrast = float(d[fg].mean()) / ev.thr if fg.any() else 0.0
        cut = ev.cut_fraction()
        s_fill = soft_ramp(fill, 0.03, 0.15)
        s_contrast = 1.0 - math.exp(-1.5 * max(0.0, contrast - 1.0))
        s_contain = 1.0 - 0.8 * soft_ramp(cut, 0.2, 0.6)
        score = s_fill * s_contrast * s_contain
        if score >= self.threshold:
            return score, None
        if ev.thr > self.clutter_threshold:
            return score, (
                f"the surroundings are too busy for the weight-free validator to confirm a subject "
                f"(score {score:.2f} < {self.threshold:.2f}); the SAM validator handles scene photos"
            )
        x1, y1, x2, y2 = box
        inside_object = global_fg is not None and float(global_fg[y1:y2, x1:x2].mean()) > 0.6
        if s_contain < min(s_fill, s_contrast) or (inside_object and fill < 0.15):
            reason = "the box cuts through or lies inside an object: draw it around the whole subject"
        elif fill < 0.03:
            reason = "no object inside the box: it covers plain background"
        else:
            reason = "the box content barely differs from its surroundings"
        return score, f"{reason} (score {score:.2f} < {self.threshold:.2f})"

    def validate(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        oh, ow = check_image(image).shape[:2]
        small, scale = resize_max(image, self.work_size)
        lab = to_lab(small)
        h, w = lab.shape[:2]
        bg, residuals = fit_background(lab, max(2, round(0.03 * min(h, w))))
        global_fg = np.linalg.norm(lab - bg, axis=2) > noise_threshold(residuals, 5.0)
        out = []
        for b in boxes:
            problem = box_problem(b.get("bbox"), ow, oh)
            if problem:
                out.append(invalid_result(b["box_id"], problem))
                continue
            x1, y1, x2, y2 = int_box([v * scale for v in b["bbox"]], w, h)
            if x2 - x1 < 2 or y2 - y1 < 2:
                out.append(invalid_result(b["box_id"], "bbox is too small to hold a subject"))
                continue
            score, reason = self.score_box(lab, (x1, y1, x2, y2), global_fg)
            out.append({"box_id": b["box_id"], "passed": reason is None, "score": round(score, 4), "reason": reason})
        return out


# --------------------------------------------------------------------------- segmenter


@register("segmenter", "classical")
class ClassicalSegmenter:
    """GrabCut seeded by the box, with a threshold mask as the fallback.

    Seeds: outside the box is background; inside, pixels that match the ring's colour are
    probable background and the rest probable foreground, which lets GrabCut converge
    in a few iterations on studio shots. GrabCut runs on the box's neighbourhood scaled
    to ``work_size``; the mask is scaled back, clipped to the box, and cleaned (largest
    component, small holes filled). ``feather_px`` > 0 adds a soft alpha for the cut-out."""

    name = "classical"

    def __init__(
        self,
        work_size: int = 320,
        iterations: int = 4,
        margin_frac: float = 0.1,
        max_hole_frac: float = 0.1,
        feather_px: float = 0.0,
    ) -> None:
        self.work_size = int(work_size)
        self.iterations = int(iterations)
        self.margin_frac = float(margin_frac)
        self.max_hole_frac = float(max_hole_frac)
        self.feather_px = float(feather_px)

    def segment(self, image: np.ndarray, image_sha: str, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        oh, ow = check_image(image).shape[:2]
        out = []
        for b in boxes:
            problem = box_problem(b.get("bbox"), ow, oh)
            if problem:
                out.append({"box_id": b["box_id"], "mask": np.zeros((oh, ow), bool), "reason": problem})
                continue
            mask, how = self.mask_for_box(image, b["bbox"])
            item: dict[str, Any] = {"box_id": b["box_id"], "mask": mask, "method": how}
            if not mask.any():
                item["reason"] = "no object found inside the box"
            elif self.feather_px > 0:
                item["alpha"] = feather(mask, self.feather_px)
            out.append(item)
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
        """GrabCut seeded by the box and the clicks (``grabcut_points``): positive points are sure
        foreground discs, negative ones sure background; with ``multimask`` also the other
        seedings. No scores (``predicted_iou``/``stability`` None): GrabCut has no calibrated one."""
        pts = check_prompt(image, bbox, points)
        return prompted_candidates(
            image,
            bbox,
            pts,
            multimask=multimask,
            work_size=self.work_size,
            margin_frac=self.margin_frac,
            max_hole_frac=self.max_hole_frac,
        )

    def mask_for_box(self, image: np.ndarray, bbox: Any) -> tuple[np.ndarray, str]:
        """The subject's mask (image size) and how it was found: ``grabcut`` or ``threshold``."""
        oh, ow = image.shape[:2]
        x1, y1, x2, y2 = int_box(bbox, ow, oh)
        near = crop_around(image, (x1, y1, x2, y2), margin_frac=self.margin_frac, work_px=self.work_size)
        bx1, by1, bx2, by2 = near.box
        ev = BoxEvidence(to_lab(near.crop), near.box, self.margin_frac)

        small = self._grabcut(near.crop, near.box, ev)
        how = "grabcut"
        box_area = (bx2 - bx1) * (by2 - by1)
        if small is None or not (0.01 * box_area <= small[by1:by2, bx1:bx2].sum() <= 0.995 * box_area):
            small = np.zeros(near.crop.shape[:2], bool)
            small[by1:by2, bx1:bx2] = ev.box_fg()
            how = "threshold"
        full = near.paste(small)
        clip = np.zeros_like(full)
        clip[y1:y2, x1:x2] = True
        full &= clip
        return clean_mask(full, self.max_hole_frac), how

    def _grabcut(self, crop: np.ndarray, box: tuple[int, int, int, int], ev: BoxEvidence) -> np.ndarray | None:
        ch, cw = crop.shape[:2]
        x1, y1, x2, y2 = box
        gc = np.full((ch, cw), cv2.GC_BGD, np.uint8)
        inside = np.where(ev.box_d() > 0.5 * ev.thr, cv2.GC_PR_FGD, cv2.GC_PR_BGD).astype(np.uint8)
        if (inside == cv2.GC_PR_FGD).mean() < 0.05:
            # The ring's colour explains the whole box (a cluttered scene, a faint subject):
            # fall back to GrabCut's plain rectangle start.
            inside[:] = cv2.GC_PR_FGD
        gc[y1:y2, x1:x2] = inside
        if not (gc == cv2.GC_BGD).any():
            # The box is the whole crop: let the crop's frame stand for the background.
            gc[0, :] = gc[-1, :] = cv2.GC_PR_BGD
            gc[:, 0] = gc[:, -1] = cv2.GC_PR_BGD
        if not ((gc == cv2.GC_PR_FGD).any() and ((gc == cv2.GC_BGD) | (gc == cv2.GC_PR_BGD)).any()):
            return None
        return run_grabcut(crop, gc, self.iterations)  # None: the caller uses the threshold mask
