"""``hitl export --format yolo-seg | voc`` (docs/archive.md § Export): YOLO segmentation and Pascal
VOC, beside the COCO and YOLO detection sets of ``archive.export``.

YOLO segmentation, Ultralytics' layout: ``images/{train,val}/<job_id>.<ext>``,
``labels/{train,val}/<job_id>.txt`` with one ``class x1 y1 x2 y2 …`` polygon (normalised) per
approved box, and ``data.yaml`` (``path``, ``train``, ``val``, ``names``). The polygon is the outer
contour of the box's mask (OpenCV ``findContours``; a mask in several pieces: its largest), the
box's rectangle when the box has no mask. Pascal VOC: ``JPEGImages/<job_id>.<ext>``,
``Annotations/<job_id>.xml`` (``bndbox`` in the devkit's 1-based inclusive pixels) and
``ImageSets/Main/{train,val}.txt``. Both split the jobs the same way: by a hash of the job id, so a
job stays in its split from one export to the next (about one in five in ``val``; with two jobs or
more, neither split is empty)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import cv2
import numpy as np

from hitl_review.statecore.artifacts import ArtifactStore

from .export_common import NO_LABEL, ExportJob, ExportSummary, category_names, load_mask, write_corrections

VAL_PERCENT = 20
SPLITS = ("train", "val")


def _bucket(job_id: str) -> int:
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")


def split_jobs(jobs: Sequence[ExportJob]) -> dict[str, str]:
    """job_id -> "train" | "val", by the job id's hash alone; with two jobs or more neither split is
    empty (the job whose hash is lowest goes to val, the highest to train, when one would be)."""
    split = {j.job_id: "val" if _bucket(j.job_id) % 100 < VAL_PERCENT else "train" for j in jobs}
    if len(jobs) >= 2:
        ranked = sorted(split, key=_bucket)
        if "val" not in split.values():
            split[ranked[0]] = "val"
        if "train" not in split.values():
            split[ranked[-1]] = "train"
    return split


def _image(artifacts: ArtifactStore, job: ExportJob, folder: Path, summary: ExportSummary) -> str:
    name = f"{job.job_id}.{job.image_name.rsplit('.', 1)[-1]}"
    if artifacts.exists(job.image_name):
        (folder / name).write_bytes(artifacts.get(job.image_name))
    else:
        summary.missing_images.append(job.image_name)
    return name


def polygon(mask: np.ndarray[Any, np.dtype[np.uint8]]) -> list[tuple[float, float]] | None:
    """The outer contour of the mask's largest piece, in pixels; None when it has no area."""
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    if not contours:
        return None
    best = max(contours, key=cv2.contourArea)
    if len(best) < 3 or cv2.contourArea(best) <= 0:
        return None
    return [(float(x), float(y)) for x, y in best.reshape(-1, 2)]


def _box_polygon(box: dict[str, Any]) -> list[tuple[float, float]]:
    x1, y1, x2, y2 = (float(v) for v in box["bbox"])
    return [(x1, y1), (x2, y1), (x2, y2), (x1, y2)]


def export_yolo_seg(jobs: Sequence[ExportJob], artifacts: ArtifactStore, out: Path) -> ExportSummary:
    summary = ExportSummary("yolo-seg", out, categories=category_names(jobs))
    for kind in ("images", "labels"):
        for s in SPLITS:
            (out / kind / s).mkdir(parents=True, exist_ok=True)
    class_id = {name: i for i, name in enumerate(summary.categories)}
    split, files = split_jobs(jobs), {}
    for job in jobs:
        s = split[job.job_id]
        files[job.job_id] = f"images/{s}/{_image(artifacts, job, out / 'images' / s, summary)}"
        lines = []
        for box in job.approved:
            points = None
            name = job.masks.get(box["box_id"])
            if name is not None and artifacts.exists(name):
                points = polygon(load_mask(artifacts, name, job.width, job.height))
                summary.masks += 1
            elif name is not None:
                summary.missing_masks.append(name)
            xy = " ".join(
                f"{min(max(x / job.width, 0.0), 1.0):.6f} {min(max(y / job.height, 0.0), 1.0):.6f}"
                for x, y in (points or _box_polygon(box))
            )
            lines.append(f"{class_id[box.get('label') or NO_LABEL]} {xy}")
        (out / "labels" / s / f"{job.job_id}.txt").write_text("".join(line + "\n" for line in lines))
        summary.annotations += len(lines)
    summary.images = len(jobs)
    names = "\n".join(f"  {i}: {json.dumps(n)}" for i, n in enumerate(summary.categories))
    data = f"path: {json.dumps(str(out.resolve()))}\ntrain: images/train\nval: images/val\n"
    (out / "data.yaml").write_text(data + (f"names:\n{names}\n" if names else "names: {}\n"))
    write_corrections(jobs, out, files)
    return summary


def _text(parent: ET.Element, tag: str, value: object) -> ET.Element:
    el = ET.SubElement(parent, tag)
    el.text = str(value)
    return el


def voc_xml(job: ExportJob, file_name: str) -> bytes:
    """One image's annotation: its size and each approved box's ``bndbox`` (1-based, inclusive)."""
    root = ET.Element("annotation")
    _text(root, "folder", "JPEGImages")
    _text(root, "filename", file_name)
    _text(ET.SubElement(root, "source"), "database", "hitl-review")
    size = ET.SubElement(root, "size")
    for tag, v in (("width", job.width), ("height", job.height), ("depth", 3)):
        _text(size, tag, v)
    _text(root, "segmented", 0)
    for box in job.approved:
        x1, y1, x2, y2 = (float(v) for v in box["bbox"])
        obj = ET.SubElement(root, "object")
        _text(obj, "name", box.get("label") or NO_LABEL)
        for tag, text in (("pose", "Unspecified"), ("truncated", "0"), ("difficult", "0")):
            _text(obj, tag, text)
        bnd = ET.SubElement(obj, "bndbox")
        for tag, v in (("xmin", round(x1) + 1), ("ymin", round(y1) + 1), ("xmax", round(x2)), ("ymax", round(y2))):
            _text(bnd, tag, v)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def export_voc(jobs: Sequence[ExportJob], artifacts: ArtifactStore, out: Path) -> ExportSummary:
    summary = ExportSummary("voc", out, categories=category_names(jobs))
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    split, files = split_jobs(jobs), {}
    for job in jobs:
        name = _image(artifacts, job, out / "JPEGImages", summary)
        files[job.job_id] = f"JPEGImages/{name}"
        (out / "Annotations" / f"{job.job_id}.xml").write_bytes(voc_xml(job, name))
        summary.annotations += len(job.approved)
    for s in SPLITS:
        ids = sorted(j for j, where in split.items() if where == s)
        (out / "ImageSets" / "Main" / f"{s}.txt").write_text("".join(f"{i}\n" for i in ids))
    summary.images = len(jobs)
    write_corrections(jobs, out, files)
    return summary
