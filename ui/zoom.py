"""The full-size view: the canvas shows the image at most ``DISPLAY_MAX_W`` pixels wide, compressed
(``ui.images.ImageStore.display``), so a reviewer who needs the detail of a large product photo asks
for it: "Full size" shows the original at its own pixels, with the boxes as they are on the canvas at
that moment, in a frame that scrolls. It is made on demand (once per image and set of boxes) and
changes nothing: edits are still made on the canvas. Escape or "Close" hides it; opening or redrawing
a job hides it too (``ui.callbacks.Callbacks.view``).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image, ImageColor, ImageDraw, ImageFont, ImageOps

from .annotator import raw_boxes
from .panel import MODEL_COLOR, Panel, display_size, from_display
from .results import write_atomic
from .session import ReviewerState
from .shown import Shown, shown_style

ZOOM_QUALITY = 90


@dataclass
class ZoomComponents:
    open_btn: gr.Button
    panel: Shown  # by its style element (ui.shown)
    note: gr.Markdown
    image: gr.Image
    close_btn: gr.Button


def zoom_layout() -> ZoomComponents:
    """The button under the canvas and the view it opens (hidden until asked for)."""
    open_btn = gr.Button("Full size (original pixels)", elem_id="zoom-btn", size="sm")
    panel = shown_style("zoom-panel", False)
    with gr.Column(elem_id="zoom-panel"):
        with gr.Row():
            note = gr.Markdown("", elem_id="zoom-note")
            close_btn = gr.Button("Close (Esc)", elem_id="zoom-close-btn", size="sm", scale=0, min_width=110)
        image = gr.Image(
            value=None,
            show_label=False,
            interactive=False,
            elem_id="zoom-image",
            buttons=[],
            format="jpeg",
        )
    return ZoomComponents(open_btn=open_btn, panel=panel, note=note, image=image, close_btn=close_btn)


def _rgb(color: Any) -> tuple[int, int, int]:
    """A box colour as the annotator holds it (an RGB list, ``#rrggbb`` or ``rgb(…)``), else the model's."""
    if isinstance(color, (list, tuple)) and len(color) >= 3:
        r, g, b = (int(v) for v in color[:3])
        return (r, g, b)
    if isinstance(color, str) and color:
        try:
            r, g, b = ImageColor.getrgb(color)[:3]
            return (r, g, b)
        except ValueError:
            pass
    return MODEL_COLOR


def canvas_boxes(panel: Panel, value: Any) -> list[tuple[list[float], str, tuple[int, int, int]]]:
    """The annotator's boxes in pixels of the original image, with their captions and colours."""
    out = []
    for b in raw_boxes(value):
        scale = float(b.get("scaleFactor") or 1.0)
        coords = from_display(panel.image, [float(b[k]) / scale for k in ("xmin", "ymin", "xmax", "ymax")])
        out.append(([round(v, 1) for v in coords], str(b.get("label") or ""), _rgb(b.get("color"))))
    return out


def full_size_view(original: Path, panel: Panel, value: Any, out_dir: Path) -> tuple[Path, int]:
    """The original image with the canvas' boxes drawn at its own pixels (a JPEG, made once per image and
    boxes), and how many boxes it shows."""
    boxes = canvas_boxes(panel, value)
    key = hashlib.sha256(json.dumps([panel.image.sha256, boxes]).encode()).hexdigest()[:32]
    path = out_dir / f"{key}.jpg"
    if path.exists():
        return path, len(boxes)
    with Image.open(original) as opened:
        img = ImageOps.exif_transpose(opened).convert("RGB")  # upright, as the boxes are
    draw = ImageDraw.Draw(img)
    width = max(2, round(max(img.size) / 500))  # lines as thick on screen as the canvas' at this size
    font = ImageFont.load_default(size=max(14, round(max(img.size) / 90)))
    for (x1, y1, x2, y2), caption, rgb in boxes:
        draw.rectangle((min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)), outline=rgb, width=width)
        if caption:
            tx, ty = min(x1, x2) + width, min(y1, y2) + width
            left, top, right, bottom = draw.textbbox((tx, ty), caption, font=font)
            draw.rectangle((left - 3, top - 3, right + 3, bottom + 3), fill=rgb)
            draw.text((tx, ty), caption, fill=(255, 255, 255), font=font)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=ZOOM_QUALITY, subsampling=0)  # crisp box outlines
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, buf.getvalue())
    return path, len(boxes)


def zoom_note(panel: Panel, shown: int) -> str:
    w, h = panel.image.width, panel.image.height
    dw, dh = display_size(w, h)
    canvas = f"the canvas shows it at {dw} × {dh}" if (dw, dh) != (w, h) else "the canvas shows it at this size"
    boxes = f"{shown} box{'es' if shown != 1 else ''} as on the canvas now"
    return f"**Full size: {w} × {h} px** ({canvas}); {boxes}. Scroll to move around; edits are made on the canvas."


class ZoomView:
    """The handlers of the full-size view."""

    def __init__(self, z: ZoomComponents, out_dir: Path) -> None:
        self.z, self.out_dir = z, out_dir

    def on_open(self, st: ReviewerState, value: Any) -> dict[Any, Any]:
        with st.lock:
            panel, original = st.panel, st.image_path
        if panel is None or not original:
            return self.z.panel.update(False)
        try:
            path, shown = full_size_view(Path(original), panel, value, self.out_dir)
        except OSError as exc:  # said where the view would be; the canvas is untouched
            note = f"The full-size image could not be made: {exc}. Press “Full size” again."
            return {**self.z.panel.update(True), self.z.note: note, self.z.image: None}
        return {**self.z.panel.update(True), self.z.note: zoom_note(panel, shown), self.z.image: str(path)}

    def on_close(self) -> dict[Any, Any]:
        return self.z.panel.update(False)


def wire_zoom(z: ZoomComponents, session: gr.State, annotator: Any, out_dir: Path) -> ZoomView:
    """Connect the view's buttons (inside the app's ``gr.Blocks``); ``annotator``'s raw value gives the boxes."""
    view = ZoomView(z, out_dir)
    outputs = [z.panel.style, z.note, z.image]
    z.open_btn.click(view.on_open, inputs=[session, annotator], outputs=outputs, preprocess=False)
    z.close_btn.click(view.on_close, outputs=[z.panel.style], queue=False)
    return view
