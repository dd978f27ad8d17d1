"""``hitl export``: the reviewed boxes, labels and masks of archived jobs as a training set, COCO
(masks as RLE through ``pycocotools.mask.encode``) or YOLO (docs/archive.md § Export); YOLO
segmentation and Pascal VOC in ``archive.export_formats``.

What is exported is what the reviewer approved (the job's ``approved_box_list``), one annotation per
approved box, with its mask where the segmenter produced one. The reviewer's corrections to the
detector's proposals (added, moved, relabelled, deleted boxes; ``archive.corrections``) go to a
file of their own, ``corrections.json``, so the approved labels and the corrections stay apart.

Layout of ``--out DIR``: ``images/<job_id>.<ext>`` (the input images, from the artifact store),
then for COCO ``annotations.json``; for YOLO ``labels/<job_id>.txt`` (``class cx cy w h``,
normalized), ``masks/<job_id>_<box_id>.png`` and ``data.yaml``; for both ``corrections.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from sqlalchemy import select

from hitl_review.statecore.artifacts import ArtifactStore

from . import corrections
from .archiver import artifact_name
from .db import Archive, archive_url
from .export_common import (
    EXPORTED_STATUSES,
    NO_LABEL,
    ExportJob,
    ExportSummary,
    category_names,
    load_mask,
    write_corrections,
)
from .export_flags import add_output_arguments
from .migrate import not_ready
from .options import EXPORT_DESCRIPTION, add_export_arguments
from .schema import ArchivedEvent, ArchivedJob


def select_jobs(archive: Archive, *, since: datetime | None = None, batch: str | None = None) -> list[ExportJob]:
    """The archived jobs to export (finished with subjects), oldest finished first."""
    query = select(ArchivedJob).where(ArchivedJob.status.in_(EXPORTED_STATUSES))
    if since is not None:
        query = query.where(ArchivedJob.finished_ts >= since)
    if batch is not None:
        query = query.where(ArchivedJob.batch == batch)
    out: list[ExportJob] = []
    with archive.reading() as s:
        for row in s.scalars(query.order_by(ArchivedJob.finished_ts, ArchivedJob.job_id)):
            events = s.scalars(
                select(ArchivedEvent)
                .where(ArchivedEvent.job_id == row.job_id, ArchivedEvent.type == "PAUSE_OPENED")
                .order_by(ArchivedEvent.event_id)
                .limit(1)
            )
            snap = row.snapshot
            approved = list(snap["approved_box_list"])
            proposed = corrections.proposals(({"type": e.type, "data": e.data} for e in events), snap["box_list"])
            subjects = (row.results or {}).get("subjects", [])
            out.append(
                ExportJob(
                    job_id=row.job_id,
                    width=int(snap["image"]["width"]),
                    height=int(snap["image"]["height"]),
                    image_name=artifact_name(snap["image"]["url"]),
                    approved=approved,
                    masks={
                        r["box_id"]: artifact_name(r["mask_url"])
                        for r in subjects
                        if r["status"] == "SUCCEEDED" and r.get("mask_url")
                    },
                    corrections=corrections.compare(proposed, approved),
                    quality={
                        r["box_id"]: {k: r.get(k) for k in ("quality", "refinements", "decided_by")}
                        for r in subjects
                        if r["status"] == "SUCCEEDED" and r.get("quality")
                    },
                )
            )
    return out


def _copy_image(artifacts: ArtifactStore, job: ExportJob, out: Path, summary: ExportSummary) -> str:
    ext = job.image_name.rsplit(".", 1)[-1]
    file_name = f"images/{job.job_id}.{ext}"
    if artifacts.exists(job.image_name):
        (out / file_name).write_bytes(artifacts.get(job.image_name))
    else:
        summary.missing_images.append(job.image_name)
    return file_name


def export_coco(jobs: Sequence[ExportJob], artifacts: ArtifactStore, out: Path) -> ExportSummary:
    from pycocotools import mask as mask_utils

    summary = ExportSummary("coco", out, categories=category_names(jobs))
    (out / "images").mkdir(parents=True, exist_ok=True)
    category_id = {name: i + 1 for i, name in enumerate(summary.categories)}
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for image_id, job in enumerate(jobs, start=1):
        file_name = _copy_image(artifacts, job, out, summary)
        image = {"id": image_id, "file_name": file_name, "width": job.width, "height": job.height}
        images.append({**image, "hitl_job_id": job.job_id})
        for box in job.approved:
            x1, y1, x2, y2 = (float(v) for v in box["bbox"])
            ann: dict[str, Any] = {
                "id": len(annotations) + 1,
                "image_id": image_id,
                "category_id": category_id[box.get("label") or NO_LABEL],
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "area": (x2 - x1) * (y2 - y1),
                "iscrowd": 0,
                "segmentation": [[x1, y1, x2, y1, x2, y2, x1, y2]],  # the box itself when there is no mask
                "hitl_box_id": box["box_id"],
                "hitl_source": box.get("source"),
            }
            gate = job.quality.get(box["box_id"])
            if gate is not None:  # the gate's scores and verdict on the mask, and who let it through
                ann["hitl_quality"] = gate["quality"]
                ann["hitl_refinements"] = [r["strategy"] for r in gate.get("refinements") or []]
                ann["hitl_decided_by"] = gate.get("decided_by")
            name = job.masks.get(box["box_id"])
            if name is not None and artifacts.exists(name):
                rle = mask_utils.encode(np.asfortranarray(load_mask(artifacts, name, job.width, job.height)))
                ann["area"] = float(mask_utils.area(rle))
                ann["segmentation"] = {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}
                summary.masks += 1
            elif name is not None:
                summary.missing_masks.append(name)
            annotations.append(ann)
    coco = {
        "info": {"description": "hitl-review: reviewer-approved boxes and masks", "date_created": _now()},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": category_id[n], "name": n, "supercategory": "subject"} for n in summary.categories],
    }
    (out / "annotations.json").write_text(json.dumps(coco))
    summary.images, summary.annotations = len(images), len(annotations)
    write_corrections(jobs, out, {im["hitl_job_id"]: im["file_name"] for im in images})
    return summary


def export_yolo(jobs: Sequence[ExportJob], artifacts: ArtifactStore, out: Path) -> ExportSummary:
    summary = ExportSummary("yolo", out, categories=category_names(jobs))
    for sub in ("images", "labels", "masks"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    class_id = {name: i for i, name in enumerate(summary.categories)}
    files: dict[str, str] = {}
    for job in jobs:
        files[job.job_id] = _copy_image(artifacts, job, out, summary)
        lines = []
        for box in job.approved:
            x1, y1, x2, y2 = (float(v) for v in box["bbox"])
            cx, cy = (x1 + x2) / 2 / job.width, (y1 + y2) / 2 / job.height
            w, h = (x2 - x1) / job.width, (y2 - y1) / job.height
            lines.append(f"{class_id[box.get('label') or NO_LABEL]} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}")
            name = job.masks.get(box["box_id"])
            if name is not None and artifacts.exists(name):
                mask = load_mask(artifacts, name, job.width, job.height)
                Image.fromarray(mask * 255).save(out / "masks" / f"{job.job_id}_{box['box_id']}.png")
                summary.masks += 1
            elif name is not None:
                summary.missing_masks.append(name)
        (out / "labels" / f"{job.job_id}.txt").write_text("".join(line + "\n" for line in lines))
        summary.annotations += len(lines)
    summary.images = len(jobs)
    names = "\n".join(f"  {i}: {json.dumps(n)}" for i, n in enumerate(summary.categories))
    (out / "data.yaml").write_text(f"path: {out.resolve()}\ntrain: images\nval: images\nnames:\n{names}\n")
    write_corrections(jobs, out, files)
    return summary


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def export(
    archive: Archive,
    artifacts: ArtifactStore,
    out: Path,
    fmt: str,
    *,
    since: datetime | None = None,
    batch: str | None = None,
) -> ExportSummary:
    jobs = select_jobs(archive, since=since, batch=batch)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "coco":
        return export_coco(jobs, artifacts, out)
    if fmt == "yolo":
        return export_yolo(jobs, artifacts, out)
    if fmt in ("yolo-seg", "voc"):
        from .export_formats import export_voc, export_yolo_seg

        return (export_yolo_seg if fmt == "yolo-seg" else export_voc)(jobs, artifacts, out)
    raise ValueError(f"unknown export format {fmt!r}")


def missing_line(s: ExportSummary, artifacts_root: str) -> str | None:
    """One line for the artifacts the store lacked (the set was written without them), or None."""
    if not s.missing_images and not s.missing_masks:
        return None
    first = (s.missing_masks or s.missing_images)[0]
    return (
        f"{len(s.missing_masks)} of {s.expected_masks} masks and {len(s.missing_images)} of {s.images} images "
        f"are not in the artifact store {artifacts_root} (e.g. {first}), so the set in {s.out} lacks them: "
        "point --artifacts (or HITL_ARTIFACTS) at the store the server wrote to, or pass --allow-missing "
        "to accept the set as it is"
    )


def _fail(args: argparse.Namespace, code: str, message: str, body: dict[str, Any] | None = None) -> int:
    if getattr(args, "json", False):
        print(json.dumps({**(body or {}), "error": {"code": code, "message": message}}))
    else:
        print(f"export: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    """``hitl export`` with parsed arguments (archive.cli). The data directory is ``--data-dir``, else
    ``HITL_DATA_DIR``, else ``.hitl``; the artifact store ``--artifacts``, else ``HITL_ARTIFACTS``, else
    the data directory's. Exit 1 when the archive is not there or, unless ``--allow-missing``, when the
    store lacked masks or images (the set is written without them); ``--json``: one JSON object on stdout."""
    data_dir = Path(args.data_dir or os.environ.get("HITL_DATA_DIR") or ".hitl").resolve()
    url = archive_url(data_dir, args.archive_url)
    problem = not_ready(url)
    if problem is not None:
        return _fail(args, "ARCHIVE_NOT_READY", problem)
    root = str(args.artifacts or os.environ.get("HITL_ARTIFACTS") or f"file://{data_dir / 'artifacts'}")
    archive = Archive(url)
    try:
        s = export(archive, ArtifactStore(root), args.out, args.format, since=args.since, batch=args.batch)
    finally:
        archive.close()
    missing = missing_line(s, root)
    failed = missing is not None and not getattr(args, "allow_missing", False)
    if getattr(args, "json", False):
        if failed:
            assert missing is not None
            return _fail(args, "ARTIFACTS_MISSING", missing, s.as_json())
        print(json.dumps(s.as_json()))
        return 0
    print(
        f"export: {s.format} in {s.out}: {s.images} images, {s.annotations} boxes, {s.masks} masks, "
        f"{len(s.categories)} labels"
    )
    if missing is not None:
        print(f"export: {'' if failed else 'warning: '}{missing}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``hitl export ARGS`` (archive.options)."""
    parser = add_export_arguments(argparse.ArgumentParser(prog="hitl export", description=EXPORT_DESCRIPTION))
    add_output_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
