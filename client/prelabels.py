"""Boxes from another system for ``hitl submit --boxes`` (docs/protocol.md § Pre-labelled jobs):
COCO (a JSON file: ``images``, ``annotations`` with ``bbox`` = [x, y, w, h] in pixels,
``categories``) or YOLO (``class cx cy w h`` per line, normalised to the image; a ``.txt`` for one
image or a folder of ``<image stem>.txt``), converted to the pixel ``[x1, y1, x2, y2]`` that
``POST /jobs`` takes. The base install has no image library: YOLO's image size is read from the
file's header here."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PrelabelBox = dict[str, Any]  # {"bbox": [x1, y1, x2, y2], "label": str | None, "score": float?}


class LabelError(ValueError):
    """A label file that cannot be read as COCO or YOLO, or that says nothing of an image."""


def _clip(x1: float, y1: float, x2: float, y2: float, width: float, height: float) -> list[float]:
    """Rounding in other tools leaves edges a hair outside the image: clipped, as the detector's are."""
    return [round(min(max(v, 0.0), lim), 2) for v, lim in ((x1, width), (y1, height), (x2, width), (y2, height))]


def coco_boxes(doc: dict[str, Any], file_name: str) -> list[PrelabelBox]:
    """The annotations of the image whose ``file_name`` (its base name) is ``file_name``."""
    try:
        images = [i for i in doc["images"] if Path(str(i["file_name"])).name == file_name]
        names = {c["id"]: str(c["name"]) for c in doc.get("categories", [])}
        if not images:
            raise LabelError(f"{file_name} is not among the COCO file's images")
        image = images[0]
        out: list[PrelabelBox] = []
        for a in doc.get("annotations", []):
            if a["image_id"] != image["id"]:
                continue
            x, y, w, h = (float(v) for v in a["bbox"])
            box: PrelabelBox = {
                "bbox": _clip(x, y, x + w, y + h, float(image["width"]), float(image["height"])),
                "label": names.get(a.get("category_id")),
            }
            if a.get("score") is not None:
                box["score"] = float(a["score"])
            out.append(box)
        return out
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, LabelError):
            raise
        raise LabelError(f"not a COCO file: {type(e).__name__} {e}") from e


def yolo_boxes(text: str, width: int, height: int, classes: list[str] | None = None) -> list[PrelabelBox]:
    """YOLO detection labels (``class cx cy w h``, normalised; a score may follow) in pixels;
    ``classes``: the names by class index (else the index is the label)."""
    out: list[PrelabelBox] = []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) not in (5, 6):
            raise LabelError(f"line {n}: expected 'class cx cy w h', got {line!r}")
        try:
            cls = int(parts[0])
            cx, cy, w, h = (float(v) for v in parts[1:5])
        except ValueError as e:
            raise LabelError(f"line {n}: {e}") from e
        if not all(math.isfinite(v) for v in (cx, cy, w, h)):
            raise LabelError(f"line {n}: not finite: {line!r}")
        if classes is not None and not 0 <= cls < len(classes):
            raise LabelError(f"line {n}: class {cls} is not among the {len(classes)} class names")
        x1, y1 = (cx - w / 2) * width, (cy - h / 2) * height
        box: PrelabelBox = {
            "bbox": _clip(x1, y1, x1 + w * width, y1 + h * height, width, height),
            "label": classes[cls] if classes is not None else str(cls),
        }
        if len(parts) == 6:
            box["score"] = float(parts[5])
        out.append(box)
    return out


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG, JPEG or WebP header, as stored (before any EXIF orientation)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return int(w), int(h)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8X":
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
        if chunk == b"VP8L":
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        if chunk == b"VP8 ":
            w, h = struct.unpack("<HH", data[26:30])
            return w & 0x3FFF, h & 0x3FFF
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            marker = data[i + 1]
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
                i += 1 if marker == 0xFF else 2
                continue
            length = int.from_bytes(data[i + 2 : i + 4], "big")
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                return int(w), int(h)
            i += 2 + length
    raise LabelError("cannot read the image's size for its YOLO labels (not a PNG, JPEG or WebP)")


@dataclass
class BoxSource:
    """``--boxes PATH`` [``--classes``]: a COCO ``.json``, a YOLO ``.txt`` (one image) or a folder of
    YOLO ``<stem>.txt`` (an image without one has no boxes, as in YOLO's own layout)."""

    path: Path
    classes: list[str] | None = None
    _coco: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.path.is_file() and self.path.suffix.lower() == ".json":
            try:
                self._coco = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise LabelError(f"{self.path}: {e}") from e
            if not isinstance(self._coco, dict) or "images" not in self._coco:
                raise LabelError(f"{self.path}: not a COCO file (no 'images')")
        elif not self.path.exists():
            raise LabelError(f"{self.path}: no such file or folder")

    def for_image(self, name: str, data: bytes) -> list[PrelabelBox]:
        """The boxes for the image file ``name`` whose bytes are ``data``."""
        if self._coco is not None:
            return coco_boxes(self._coco, Path(name).name)
        label = self.path / f"{Path(name).stem}.txt" if self.path.is_dir() else self.path
        if label.stem != Path(name).stem:
            raise LabelError(f"{label.name} labels the image {label.stem}.*, not {name} (YOLO: one .txt per image)")
        if not label.exists():
            return []
        width, height = image_size(data)
        return yolo_boxes(label.read_text(encoding="utf-8"), width, height, self.classes)


def read_classes(spec: str) -> list[str]:
    """``--classes``: a file of names (one a line, or a YOLO ``data.yaml``'s ``names:`` list in
    its plain one-line form) or the names separated by commas."""
    path = Path(spec)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines():
            if line.startswith("names:") and "[" in line:
                return [n.strip().strip("'\"") for n in line.split("[", 1)[1].rsplit("]", 1)[0].split(",")]
        return [n.strip() for n in text.splitlines() if n.strip()]
    return [n.strip() for n in spec.split(",") if n.strip()]
