"""When a box on the canvas counts as moved, and where a moved box lands (used by ``ui.annotator``).

The canvas holds each box in its own units (image pixels times the box's ``scaleFactor``), so a box
read back carries float noise. Two rules keep the submission honest:

- a box within ``SAME_PLACE_TOL`` image pixels of where the model put it is unmoved and keeps the
  model's exact coordinates (no rounding may read as an edit; 0.5 px, so a 1 px nudge still counts);
- a box that was only shifted (its width and height unchanged within the same tolerance: a drag, or
  a nudge with the arrow keys, see ``ui.box_list_assets``) keeps its exact size and moves by whole
  pixels: a model box at x = 100.37 nudged right once is at 101.37, not rounded to 101.

Anything else (a resize) is rounded to whole pixels by ``ui.annotator.clamp_bbox`` as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from hitl_review.statecore.models import BBox

SAME_PLACE_TOL = 0.5  # image pixels


def same_place(a: Sequence[float], b: Sequence[float], tol: float = SAME_PLACE_TOL) -> bool:
    """Every corner of ``a`` within ``tol`` of ``b``'s."""
    return all(abs(float(p) - float(q)) <= tol for p, q in zip(a, b, strict=True))


def translated_bbox(
    orig: Sequence[float], raw: Sequence[float], width: float, height: float, tol: float = SAME_PLACE_TOL
) -> BBox | None:
    """``orig`` shifted by whole pixels to where ``raw`` lies, kept inside the image; None when ``raw``
    is not a plain shift of ``orig`` (its width or height differs by more than ``tol``)."""
    ox1, oy1, ox2, oy2 = (float(v) for v in orig)
    rx1, ry1, rx2, ry2 = (float(v) for v in raw)
    rx1, rx2 = sorted((rx1, rx2))
    ry1, ry2 = sorted((ry1, ry2))
    if abs((rx2 - rx1) - (ox2 - ox1)) > tol or abs((ry2 - ry1) - (oy2 - oy1)) > tol:
        return None
    dx = float(round((rx1 - ox1 + rx2 - ox2) / 2))
    dy = float(round((ry1 - oy1 + ry2 - oy2) / 2))
    dx = min(max(dx, -ox1), float(width) - ox2)
    dy = min(max(dy, -oy1), float(height) - oy2)
    return (ox1 + dx, oy1 + dy, ox2 + dx, oy2 + dy)
