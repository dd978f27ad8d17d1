"""The results panel of an ended job: cut-outs on a checkerboard, masks over the image, the files.

Also ``write_atomic``, the one way the app writes a file that another
reviewer's session may be reading or writing at the same time.
"""

from __future__ import annotations

import io
import os
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from hitl_review.statecore.models import JobResults
from hitl_review.statecore.states import JobStatus


def checkerboard(size: tuple[int, int], cell: int = 12) -> Image.Image:
    """The usual transparency background: light grey and white squares."""
    w, h = size
    tile = Image.new("RGB", (cell * 2, cell * 2), (255, 255, 255))
    tile.paste((204, 204, 204), (0, 0, cell, cell))
    tile.paste((204, 204, 204), (cell, cell, cell * 2, cell * 2))
    board = Image.new("RGB", (w, h))
    for y in range(0, h, cell * 2):
        for x in range(0, w, cell * 2):
            board.paste(tile, (x, y))
    return board


def on_checkerboard(cutout: Image.Image) -> Image.Image:
    rgba = cutout.convert("RGBA")
    board = checkerboard(rgba.size).convert("RGBA")
    return Image.alpha_composite(board, rgba).convert("RGB")


def mask_overlay(
    image: Image.Image, mask: Image.Image, color: tuple[int, int, int] = (255, 0, 102), alpha: float = 0.5
) -> Image.Image:
    """The image with the mask tinted and everything outside it dimmed, so the cut stands out."""
    base = image.convert("RGB")
    m = mask.convert("L")
    if m.size != base.size:
        m = m.resize(base.size, Image.Resampling.NEAREST)
    inside = m.point(lambda v: 255 if v > 127 else 0)
    tinted = Image.blend(base, Image.new("RGB", base.size, color), alpha)
    dimmed = base.point(lambda v: int(v * 0.35))
    return Image.composite(tinted, dimmed, inside)


@dataclass
class ResultsView:
    summary: str
    cutouts: list[tuple[str, str]]  # (image path, caption): cut-outs on a checkerboard
    overlays: list[tuple[str, str]]  # (image path, caption): masks over the image
    files: list[str]  # the original PNGs, for download


def _slug(text: str | None) -> str:
    s = re.sub(r"[^A-Za-z0-9_-]+", "-", text or "subject").strip("-")
    return (s or "subject")[:40]


PREVIEW_QUALITY = 88  # the results panel's previews: JPEG (the downloads stay the artifacts' own PNG)


def write_atomic(path: Path, data: bytes | Image.Image) -> str:
    """Write whole or not at all: two reviewers may render the same finished job at once. An image is
    saved as its name says: ``.jpg`` at ``PREVIEW_QUALITY``, else PNG."""
    if isinstance(data, Image.Image):
        buf = io.BytesIO()
        if path.suffix == ".jpg":
            data.convert("RGB").save(buf, "JPEG", quality=PREVIEW_QUALITY, subsampling=0)  # crisp cut edges
        else:
            data.save(buf, "PNG")
        data = buf.getvalue()
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return str(path)


def results_view(
    results: JobResults, fetch: Callable[[str], bytes], image_bytes: bytes | None, out_dir: Path
) -> ResultsView:
    """Files and captions for the results panel; ``fetch`` downloads an artifact URL."""
    out_dir.mkdir(parents=True, exist_ok=True)
    base = Image.open(io.BytesIO(image_bytes)).convert("RGB") if image_bytes else None
    cutouts: list[tuple[str, str]] = []
    overlays: list[tuple[str, str]] = []
    files: list[str] = []
    lines = [f"**{results.status.value}**" + (f" ({results.reason_code})" if results.reason_code else "")]
    done = [s for s in results.subjects if s.status == "SUCCEEDED"]
    lines.append(f"{len(done)} of {len(results.subjects)} subject{'s' if len(results.subjects) != 1 else ''} cut out.")
    for s in results.subjects:
        caption = f"{s.label or '(no label)'} — {s.box_id}"
        if s.status != "SUCCEEDED":
            lines.append(f"- {s.status}: {s.label or '(no label)'} ({s.box_id}) — {s.reason or 'no reason given'}")
            continue
        if s.quality is not None:  # the quality gate's word on the mask (docs/protocol.md § Cut-out quality)
            caption += f" — gate {s.quality.verdict}"
            if s.quality.verdict == "FAIL":
                tried = f" after {len(s.refinements)} refinement(s)" if s.refinements else ""
                why = "; ".join(s.quality.reasons) or "no reason given"
                lines.append(
                    f"- Check this cut-out: {s.label or '(no label)'} ({s.box_id}) failed the gate{tried} — {why}"
                )
        stem = f"{_slug(s.label)}_{s.box_id}"
        if s.cutout_url:
            raw = fetch(s.cutout_url)
            files.append(write_atomic(out_dir / f"{stem}_cutout.png", raw))
            preview = on_checkerboard(Image.open(io.BytesIO(raw)))
            # Previews as JPEG: a PNG of each took ~0.5 s of CPU per finished job, on the cores the page and the
            # next job's opening share (py-spy of the UI during the reviewer benchmark: 26 % of its samples).
            cutouts.append((write_atomic(out_dir / f"{stem}_cutout_preview.jpg", preview), caption))
        if s.mask_url:
            raw = fetch(s.mask_url)
            files.append(write_atomic(out_dir / f"{stem}_mask.png", raw))
            if base is not None:
                overlay = mask_overlay(base, Image.open(io.BytesIO(raw)))
                overlays.append((write_atomic(out_dir / f"{stem}_overlay.jpg", overlay), caption))
    if results.status == JobStatus.EMPTY_SELECTION:
        lines.append("The reviewer chose to cut nothing.")
    return ResultsView(summary="\n".join(lines), cutouts=cutouts, overlays=overlays, files=files)
