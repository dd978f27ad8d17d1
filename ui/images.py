"""Local copies of the jobs' images and results, shared by every reviewer session of one app.

The annotator and the galleries show files, so the job's image is downloaded
once (content-addressed by its sha256) and linked under a name that says which
pause the annotator shows (``ui.panel.panel_image_name``). The canvas is given a
display copy: a JPEG at most ``DISPLAY_MAX_W`` pixels wide (``ui.panel.display_size``),
made once per image, so the browser fetches and decodes a fraction of a large photo's
bytes; the boxes go to the canvas in its pixels and come back in the original's
(``ui.panel.to_display``/``from_display``). Results and mask reviews use the original.
"""

from __future__ import annotations

import io
import os
import shutil
import threading
from pathlib import Path

from PIL import Image, ImageOps

from hitl_review.client import HitlClient
from hitl_review.statecore.models import JobSnapshot

from .panel import Panel, display_size, panel_image_name
from .results import ResultsView, results_view, write_atomic
from .session import ReviewerState

_EXT = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp"}
THUMB_SIZE = (96, 72)
DISPLAY_QUALITY = 85  # JPEG quality of the canvas' copy


class ImageStore:
    """Files under ``root``: ``images/`` (inputs, one per sha256, and one link per pause), ``display/``
    (the canvas' copies, one per sha256) and ``results/<job>/``."""

    def __init__(self, root: Path) -> None:
        self.image_dir = root / "images"
        self.display_dir = root / "display"
        self.results_dir = root / "results"
        self.thumb_dir = root / "thumbs"

    def local(self, sha256: str) -> Path | None:
        """The image with this sha256, when it was downloaded already."""
        return next((q for q in (self.image_dir / f"{sha256}{e}" for e in _EXT.values()) if q.exists()), None)

    def thumbnail(self, job_id: str, c: HitlClient) -> str | None:
        """A small JPEG of the job's image for the queue (made once per job; a job's image never changes).
        The image itself is kept too: opening the job then needs no download (it was prefetched)."""
        p = self.thumb_dir / f"{job_id}.jpg"
        if p.exists():
            return str(p)
        local = self.fetch(c.get_job(job_id), c)
        img = Image.open(local)
        img.thumbnail(THUMB_SIZE)
        buf = io.BytesIO()
        img.convert("RGB").save(buf, "JPEG", quality=80)
        self.thumb_dir.mkdir(parents=True, exist_ok=True)
        return write_atomic(p, buf.getvalue())

    def fetch(self, snap: JobSnapshot, c: HitlClient) -> Path:
        """``snap``'s image as a local file: downloaded once, then found by its sha256."""
        found = self.local(snap.image.sha256)
        if found is not None:
            return found
        data = c.download(snap.image.url)
        fmt = Image.open(io.BytesIO(data)).format or "PNG"
        self.image_dir.mkdir(parents=True, exist_ok=True)
        return Path(write_atomic(self.image_dir / f"{snap.image.sha256}{_EXT.get(fmt, '.png')}", data))

    def ensure(self, st: ReviewerState, c: HitlClient) -> str | None:
        """The open job's image as a local file (downloaded once); remembered in ``st.image_path``."""
        snap = st.snapshot
        if snap is None:
            return None
        st.image_path = str(self.fetch(snap, c))
        return st.image_path

    def display(self, original: Path, sha256: str, width: int, height: int) -> Path:
        """The canvas' copy of an image: JPEG at ``display_size`` of the snapshot's ``width`` and
        ``height`` (the boxes' frame), made once per image; transparency over white."""
        p = self.display_dir / f"{sha256}.jpg"
        if p.exists():
            return p
        img = ImageOps.exif_transpose(Image.open(original))  # upright already (the upload applied it)
        size = display_size(width, height)
        if size != img.size:
            img = img.resize(size, Image.Resampling.LANCZOS)
        if img.mode in ("RGBA", "LA", "P"):
            img = img.convert("RGBA")
            flat = Image.new("RGB", img.size, (255, 255, 255))
            flat.paste(img, mask=img.getchannel("A"))
            img = flat
        buf = io.BytesIO()
        img.convert("RGB").save(buf, "JPEG", quality=DISPLAY_QUALITY)
        self.display_dir.mkdir(parents=True, exist_ok=True)
        return Path(write_atomic(p, buf.getvalue()))

    def for_panel(self, st: ReviewerState, panel: Panel) -> str:
        """The job's display image under a name that says which pause the annotator shows (a hard link)."""
        base = self.display(Path(st.image_path or ""), panel.image.sha256, panel.image.width, panel.image.height)
        p = self.image_dir / panel_image_name(panel, base.suffix)
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
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
