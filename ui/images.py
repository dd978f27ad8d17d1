"""Local copies of the jobs' images and results, shared by every reviewer session of one app.

The annotator and the galleries show files, so the job's image is downloaded
once (content-addressed by its sha256) and linked under a name that says which
pause the annotator shows (``ui.panel.panel_image_name``).
"""

from __future__ import annotations

import io
import os
import shutil
import threading
from pathlib import Path

from PIL import Image

from hitl_review.client import HitlClient

from .panel import Panel, panel_image_name
from .results import ResultsView, results_view, write_atomic
from .session import ReviewerState

_EXT = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp"}
THUMB_SIZE = (96, 72)


class ImageStore:
    """Files under ``root``: ``images/`` (inputs, one per sha256, and one link per pause) and ``results/<job>/``."""

    def __init__(self, root: Path) -> None:
        self.image_dir = root / "images"
        self.results_dir = root / "results"
        self.thumb_dir = root / "thumbs"

    def thumbnail(self, job_id: str, c: HitlClient) -> str | None:
        """A small JPEG of the job's image for the queue (made once per job; a job's image never changes)."""
        p = self.thumb_dir / f"{job_id}.jpg"
        if p.exists():
            return str(p)
        snap = c.get_job(job_id)
        local = next(
            (q for q in (self.image_dir / f"{snap.image.sha256}{e}" for e in _EXT.values()) if q.exists()), None
        )
        data = local.read_bytes() if local is not None else c.download(snap.image.url)
        img = Image.open(io.BytesIO(data))
        img.thumbnail(THUMB_SIZE)
        buf = io.BytesIO()
        img.convert("RGB").save(buf, "JPEG", quality=80)
        self.thumb_dir.mkdir(parents=True, exist_ok=True)
        return write_atomic(p, buf.getvalue())

    def ensure(self, st: ReviewerState, c: HitlClient) -> str | None:
        """The open job's image as a local file (downloaded once); remembered in ``st.image_path``."""
        snap = st.snapshot
        if snap is None:
            return None
        for ext in _EXT.values():
            p = self.image_dir / f"{snap.image.sha256}{ext}"
            if p.exists():
                st.image_path = str(p)
                return st.image_path
        data = c.download(snap.image.url)
        fmt = Image.open(io.BytesIO(data)).format or "PNG"
        self.image_dir.mkdir(parents=True, exist_ok=True)
        p = self.image_dir / f"{snap.image.sha256}{_EXT.get(fmt, '.png')}"
        st.image_path = write_atomic(p, data)
        return st.image_path

    def for_panel(self, st: ReviewerState, panel: Panel) -> str:
        """The job's image under a name that says which pause the annotator shows (a hard link)."""
        base = Path(st.image_path or "")
        p = self.image_dir / panel_image_name(panel, base.suffix)
        if not p.exists():
            tmp = p.with_name(f".{p.name}.{threading.get_ident()}.part")
            try:
                os.link(base, tmp)
            except OSError:
                shutil.copyfile(base, tmp)
            os.replace(tmp, p)
        return str(p)

    def results(self, st: ReviewerState, c: HitlClient) -> ResultsView:
        """The ended job's results, downloaded and rendered for the results panel."""
        snap = st.snapshot
        assert snap is not None
        res = c.results(snap.job_id)
        image = Path(st.image_path).read_bytes() if st.image_path else None
        return results_view(res, c.download, image, self.results_dir / snap.job_id)
