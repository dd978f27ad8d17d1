"""What every ``hitl export`` format shares (archive.export, archive.export_formats): the jobs as
read from the archive, the summary, the masks, the labels' order and ``corrections.json``."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from hitl_review.statecore.artifacts import ArtifactStore

from . import corrections

EXPORTED_STATUSES = ("SUCCEEDED", "PARTIAL_SUCCEEDED")
NO_LABEL = "object"


@dataclass
class ExportJob:
    job_id: str
    width: int
    height: int
    image_name: str
    approved: list[dict[str, Any]]
    masks: dict[str, str]  # box_id -> mask artifact name (segmented boxes only)
    corrections: corrections.Corrections
    # box_id -> the quality gate's verdict on its mask, its refinements and who let it through
    quality: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ExportSummary:
    format: str
    out: Path
    images: int = 0
    annotations: int = 0
    masks: int = 0
    categories: list[str] = field(default_factory=list)
    # Artifacts the store does not hold: the set is written without them.
    missing_images: list[str] = field(default_factory=list)
    missing_masks: list[str] = field(default_factory=list)

    @property
    def expected_masks(self) -> int:
        return self.masks + len(self.missing_masks)

    def as_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "out": str(self.out),
            "images": self.images,
            "annotations": self.annotations,
            "masks": self.masks,
            "labels": self.categories,
            "missing": {"images": self.missing_images, "masks": self.missing_masks},
        }


def load_mask(artifacts: ArtifactStore, name: str, width: int, height: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A mask PNG (the image's size, nonzero = the subject) as a 0/1 array."""
    with Image.open(io.BytesIO(artifacts.get(name))) as im:
        mask = np.asarray(im.convert("L")) > 0
    if mask.shape != (height, width):
        raise ValueError(f"mask {name} is {mask.shape[1]}x{mask.shape[0]}, its image {width}x{height}")
    return mask.astype(np.uint8)


def category_names(jobs: Sequence[ExportJob]) -> list[str]:
    return sorted({b.get("label") or NO_LABEL for j in jobs for b in j.approved})


CORRECTION_KINDS = ("added", "moved", "relabelled", "deleted")


def write_corrections(jobs: Sequence[ExportJob], out: Path, files: dict[str, str]) -> None:
    per_job = [{"job_id": j.job_id, "image": files[j.job_id], **j.corrections.as_json()} for j in jobs]
    totals = {k: sum(len(j.corrections.as_json()[k]) for j in jobs) for k in CORRECTION_KINDS}
    body = {"format": "hitl-corrections/1", "totals": totals, "jobs": per_job}
    (out / "corrections.json").write_text(json.dumps(body, indent=1))
