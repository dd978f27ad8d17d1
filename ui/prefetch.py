"""The next job's image, fetched while the reviewer works on this one (``Callbacks.on_next`` opens it).

After a job is drawn, and after a submission, a thread asks which job N would open next (the oldest
waiting job nobody else claimed, other than the one on screen), reads its snapshot and makes its
image local with the canvas' display copy (``ui.images.ImageStore``): N then has nothing to download.

What N shows is never taken from here: it claims the job and reads its snapshot in one round trip
(``POST …/claim?snapshot=true``), and the prefetched copy counts only when it is the very state that
claim answered (:func:`usable`: same job, version and pause). A prefetched job whose pause was
answered, or that another reviewer claimed meanwhile, is not shown stale: its snapshot is dropped
and the fresh one drawn (the image, addressed by its sha256, is the same whatever the state).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hitl_review.client import HitlClient
from hitl_review.statecore.models import JobSnapshot

from .session import ReviewerState


@dataclass(frozen=True)
class Prefetched:
    """A job fetched ahead: its snapshot as it was then, and its images on disk."""

    snapshot: JobSnapshot
    image: Path
    display: Path

    @property
    def job_id(self) -> str:
        return self.snapshot.job_id


def pause_token(snap: JobSnapshot | None) -> str | None:
    return snap.active_pause.pause_token if snap is not None and snap.active_pause is not None else None


def usable(pre: Prefetched | None, fresh: JobSnapshot) -> bool:
    """Whether ``pre`` is the state ``fresh`` (the claim's snapshot) shows: same job, version and pause."""
    return (
        pre is not None
        and pre.job_id == fresh.job_id
        and pre.snapshot.version == fresh.version
        and pause_token(pre.snapshot) == pause_token(fresh)
        and pause_token(fresh) is not None
    )


def take(st: ReviewerState, fresh: JobSnapshot) -> Prefetched | None:
    """The prefetched job when it is ``fresh``'s state (then used up), else None; a stale one is dropped."""
    with st.lock:
        pre, st.prefetched = st.prefetched, None
    return pre if isinstance(pre, Prefetched) and usable(pre, fresh) else None


class _Images(Protocol):
    def fetch(self, snap: JobSnapshot, c: HitlClient) -> Path: ...

    def display(self, original: Path, sha256: str, width: int, height: int) -> Path: ...


def prefetch(st: ReviewerState, client: HitlClient, images: _Images, exclude: list[str]) -> Prefetched | None:
    """Fetch the job N would open next (not one of ``exclude``) into ``st.prefetched``; None when none waits."""
    found = client.next_job(exclude=exclude)
    if found is None:
        return None
    snap = client.get_job(found.job_id)
    if pause_token(snap) is None:
        return None
    image = images.fetch(snap, client)
    display = images.display(image, snap.image.sha256, snap.image.width, snap.image.height)
    pre = Prefetched(snapshot=snap, image=image, display=display)
    with st.lock:
        if st.job_id not in exclude and st.job_id is not None:
            return None  # another job was opened meanwhile: its own prefetch comes
        st.prefetched = pre
    return pre


class Prefetcher:
    """One prefetch at a time per session, on a daemon thread (a failure only means no prefetch)."""

    def __init__(self, images: _Images) -> None:
        self.images = images
        self._busy: set[int] = set()
        self._lock = threading.Lock()

    def start(self, st: ReviewerState, client: HitlClient) -> None:
        exclude = [j for j in (st.job_id,) if j]
        with self._lock:
            if id(st) in self._busy:
                return
            self._busy.add(id(st))

        def run() -> None:
            try:
                prefetch(st, client, self.images, exclude)
            except Exception:  # N fetches what it needs itself
                pass
            finally:
                with self._lock:
                    self._busy.discard(id(st))

        threading.Thread(target=run, name="hitl-ui-prefetch", daemon=True).start()
