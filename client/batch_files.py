"""The files of a batch: walking the inputs for images (recognised by content), naming each file's
output directory, and writing a finished job's masks, cut-outs and results.json there."""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hitl_review.statecore.media import SNIFF_BYTES, sniff
from hitl_review.statecore.models import JobResults

from .api import HitlClient

UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


@dataclass
class WalkResult:
    images: list[Path] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def walk_inputs(
    inputs: Iterable[str | os.PathLike[str]], *, exclude: Iterable[str | os.PathLike[str]] = ()
) -> WalkResult:
    """Expand files and directories (recursively, in sorted order) into image files.

    Files are recognised by their first bytes, not their names. Anything that is
    not PNG, JPEG or WebP is reported in ``skipped``. Inside directories, hidden
    entries (``.name``) are passed over silently, and so are the paths in
    ``exclude`` (the output directory and the manifest, so a rerun never submits
    its own cut-outs). A file named twice is taken once.
    """
    excluded = {Path(p).resolve() for p in exclude}
    result = WalkResult()
    seen: set[Path] = set()

    def consider(path: Path) -> None:
        real = path.resolve()
        if real in seen or real in excluded:
            return
        seen.add(real)
        try:
            with open(path, "rb") as fh:
                head = fh.read(SNIFF_BYTES)
        except OSError as exc:
            result.skipped.append(Skipped(path, f"unreadable: {exc.strerror or exc}"))
            return
        if sniff(head) is None:
            result.skipped.append(Skipped(path, "not a PNG, JPEG or WebP image"))
        else:
            result.images.append(path)

    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                rootp = Path(root)
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and (rootp / d).resolve() not in excluded)
                for name in sorted(files):
                    if not name.startswith("."):
                        consider(rootp / name)
        elif path.is_file():
            consider(path)
        elif path.exists():
            result.skipped.append(Skipped(path, "not a regular file"))
        else:
            result.skipped.append(Skipped(path, "no such file or directory"))
    return result


def output_dir_names(images: Iterable[Path]) -> dict[Path, str]:
    """``<file-stem>`` per image; stems shared by several files get a short hash of the path appended."""
    images = list(images)
    stems = Counter(p.stem for p in images)
    names: dict[Path, str] = {}
    for p in images:
        stem = UNSAFE_NAME_CHARS.sub("_", p.stem) or "image"
        if stems[p.stem] > 1:
            stem += "-" + hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:8]
        names[p] = stem
    return names


# ---------------------------------------------------------------------- downloading


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def download_outputs(client: HitlClient, results: JobResults, out_dir: Path) -> list[Path]:
    """``mask_<box_id>.png`` and ``cutout_<box_id>.png`` per subject, then ``results.json`` (written last,
    so its presence means the directory is complete)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for subject in results.subjects:
        box = UNSAFE_NAME_CHARS.sub("_", subject.box_id)
        for kind, url in (("mask", subject.mask_url), ("cutout", subject.cutout_url)):
            if url:
                target = out_dir / f"{kind}_{box}.png"
                _write_atomic(target, client.download(url))
                written.append(target)
    target = out_dir / "results.json"
    _write_atomic(target, results.model_dump_json(indent=2).encode())
    written.append(target)
    return written
