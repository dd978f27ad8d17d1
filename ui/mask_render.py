"""The mask review's pictures (ui.mask_review): the subject's neighbourhood with its mask laid over it and
the reviewer's points as dots, and its cut-out on a checkerboard. Pure functions of PIL images.

The subject is shown cropped to its box and a margin, scaled so its longer side is ``VIEW_PX``: the
browser shows it at that size (Gradio's image scales down, never up), and a click there maps back to
the image's pixels through the same :class:`Window`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageChops, ImageDraw, ImageFilter

from .mask_review import Point
from .results import checkerboard

VIEW_PX = 560  # the longer side of the picture the reviewer clicks on
MARGIN = 0.25  # of the box's size, on each side
MIN_MARGIN_PX = 16
MASK_COLOR = (255, 0, 102)
EDGE_COLOR = (255, 230, 0)
BOX_COLOR = (37, 99, 235)
POSITIVE = (22, 163, 74)
NEGATIVE = (220, 38, 38)
DOT_PX = 7


@dataclass(frozen=True)
class Window:
    """The part of the image shown (``x0, y0, x1, y1`` in image pixels) and its scale on the page."""

    x0: int
    y0: int
    x1: int
    y1: int
    scale: float

    @property
    def size(self) -> tuple[int, int]:
        return max(1, round((self.x1 - self.x0) * self.scale)), max(1, round((self.y1 - self.y0) * self.scale))

    def to_image(self, x: float, y: float) -> tuple[float, float]:
        """A point of the shown picture (its own pixels) in the image's pixels."""
        return self.x0 + x / self.scale, self.y0 + y / self.scale

    def to_view(self, x: float, y: float) -> tuple[float, float]:
        return (x - self.x0) * self.scale, (y - self.y0) * self.scale


def window_for(bbox: Iterable[float], width: int, height: int, view_px: int = VIEW_PX) -> Window:
    """The box and a margin, inside the image, scaled so the longer side is ``view_px`` (at most ×4)."""
    x1, y1, x2, y2 = (float(v) for v in bbox)
    mx = max(MIN_MARGIN_PX, (x2 - x1) * MARGIN)
    my = max(MIN_MARGIN_PX, (y2 - y1) * MARGIN)
    x0, y0 = max(0, int(x1 - mx)), max(0, int(y1 - my))
    xe, ye = min(width, int(round(x2 + mx))), min(height, int(round(y2 + my)))
    xe, ye = max(xe, x0 + 1), max(ye, y0 + 1)
    scale = min(4.0, view_px / max(xe - x0, ye - y0))
    return Window(x0, y0, xe, ye, scale)


def load(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def _mask_l(mask: Image.Image | None, size: tuple[int, int]) -> Image.Image | None:
    if mask is None:
        return None
    m = mask.convert("L")
    if m.size != size:
        m = m.resize(size, Image.Resampling.NEAREST)
    return m.point(lambda v: 255 if v > 127 else 0)


def subject_view(
    image: Image.Image,
    mask: Image.Image | None,
    bbox: Iterable[float],
    points: Iterable[Point],
    window: Window,
) -> Image.Image:
    """The window of ``image`` with ``mask`` tinted (its outline drawn), the rest dimmed a little, the
    box outlined and the points as dots: green for the subject, red for not the subject."""
    base = image.convert("RGB")
    m = _mask_l(mask, base.size)
    crop = base.crop((window.x0, window.y0, window.x1, window.y1))
    if m is not None:
        mc = m.crop((window.x0, window.y0, window.x1, window.y1))
        tinted = Image.blend(crop, Image.new("RGB", crop.size, MASK_COLOR), 0.45)
        dimmed = crop.point(lambda v: int(v * 0.6))
        crop = Image.composite(tinted, dimmed, mc)
    view = crop.resize(window.size, Image.Resampling.LANCZOS if window.scale < 1 else Image.Resampling.BICUBIC)
    if m is not None:
        mv = m.crop((window.x0, window.y0, window.x1, window.y1)).resize(view.size, Image.Resampling.NEAREST)
        edge = ImageChops.subtract(mv.filter(ImageFilter.MaxFilter(3)), mv.filter(ImageFilter.MinFilter(3)))
        view.paste(EDGE_COLOR, (0, 0), edge)
    draw = ImageDraw.Draw(view)
    x1, y1, x2, y2 = (float(v) for v in bbox)
    (a, b), (c, d) = window.to_view(x1, y1), window.to_view(x2, y2)
    draw.rectangle((a, b, c - 1, d - 1), outline=BOX_COLOR, width=2)
    for p in points:
        x, y = window.to_view(p.x, p.y)
        ring = (x - DOT_PX - 2, y - DOT_PX - 2, x + DOT_PX + 2, y + DOT_PX + 2)
        draw.ellipse(ring, fill=(255, 255, 255))
        draw.ellipse((x - DOT_PX, y - DOT_PX, x + DOT_PX, y + DOT_PX), fill=POSITIVE if p.positive else NEGATIVE)
    return view


def cutout_view(
    image: Image.Image | None, mask: Image.Image | None, cutout: Image.Image | None, bbox: Iterable[float]
) -> Image.Image | None:
    """The subject's cut-out on a checkerboard, cropped to its box: the server's RGBA cut-out when given
    (of the image's size, or already cropped), else one made of ``image`` and ``mask`` (a preview's)."""
    x1, y1, x2, y2 = (int(round(float(v))) for v in bbox)
    if cutout is None:
        if image is None or mask is None:
            return None
        rgba = image.convert("RGBA")
        alpha = _mask_l(mask, rgba.size)
        assert alpha is not None
        rgba.putalpha(alpha)
        cutout = rgba
    rgba = cutout.convert("RGBA")
    if image is not None and rgba.size == image.size:
        rgba = rgba.crop((x1, y1, max(x2, x1 + 1), max(y2, y1 + 1)))
    scale = min(4.0, 280 / max(rgba.size))
    if abs(scale - 1) > 0.05:
        size = (max(1, round(rgba.width * scale)), max(1, round(rgba.height * scale)))
        rgba = rgba.resize(size, Image.Resampling.BICUBIC)
    board = checkerboard(rgba.size).convert("RGBA")
    return Image.alpha_composite(board, rgba).convert("RGB")


def clicks_from(raw: str | None) -> list[dict[str, Any]]:
    """The clicks the page's script sends (``ui.mask_assets``): ``[{"x", "y", "positive", "src"}]``,
    checked like any input from the browser; what is malformed is dropped."""
    try:
        items = json.loads(raw or "[]")
    except ValueError:
        return []
    out = []
    for it in items if isinstance(items, list) else []:
        try:
            out.append(
                {"x": float(it["x"]), "y": float(it["y"]), "positive": bool(it["positive"]), "src": str(it["src"])}
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out


def picture_name(pause_token: str, box_id: str, tag: str) -> str:
    """The stem of a picture's file name: it says which pause and subject it shows (``picture_of``);
    ``tag`` keeps one reviewer's pictures apart from another's."""
    return f"{pause_token}__{box_id}__{tag}"


def picture_of(src: str) -> tuple[str, str] | None:
    """The pause and subject a picture of the panel shows, from its file name (``…/pause__box__tag_view.png``)."""
    parts = Path(src.split("?", 1)[0]).stem.split("__")
    return (parts[0], parts[1]) if len(parts) >= 3 else None
