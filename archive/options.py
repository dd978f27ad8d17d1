"""The options of the archive's commands (docs/archive.md § Export, § Migrations), standard library
only: ``archive.cli`` puts them on ``hitl``'s parser, ``archive.export.main`` and
``archive.migrate.main`` on their own."""

from __future__ import annotations

import argparse
from datetime import UTC, date, datetime
from pathlib import Path

EXPORT_DESCRIPTION = (
    "Write the reviewer-approved boxes, labels and masks of archived jobs as a training set: COCO "
    "(annotations.json, masks as RLE) or YOLO (labels/*.txt, masks/*.png, data.yaml), the images "
    "beside them, and the reviewer's corrections to the detector's proposals (added, moved, "
    "relabelled, deleted boxes) apart in corrections.json."
)


def parse_since(text: str) -> datetime:
    """A date (midnight UTC) or an ISO date-time (UTC unless it says otherwise)."""
    try:
        d = date.fromisoformat(text)
        return datetime(d.year, d.month, d.day, tzinfo=UTC)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a date or date-time: {text!r}") from e
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _add_location(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR", help="data directory (default .hitl)")
    p.add_argument(
        "--archive-url",
        default=None,
        metavar="URL",
        help="the archive (default HITL_ARCHIVE_URL, else <data-dir>/archive.sqlite3)",
    )


def add_export_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--format",
        required=True,
        choices=("coco", "yolo", "yolo-seg", "voc"),
        help="COCO (RLE masks), YOLO (boxes), YOLO segmentation (polygons, train/val splits) or Pascal VOC",
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory to write (created)")
    p.add_argument("--since", type=parse_since, metavar="DATE", help="only jobs finished at or after DATE (UTC)")
    p.add_argument("--batch", metavar="NAME", help="only the jobs of `hitl submit --batch NAME`")
    _add_location(p)
    p.add_argument("--artifacts", default=None, metavar="ROOT", help="artifact store (default <data-dir>/artifacts)")
    return p


def add_upgrade_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _add_location(p)
    p.add_argument("--check", action="store_true", help="report the schema version, change nothing (1: behind)")
    return p
