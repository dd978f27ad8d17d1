"""Artifact garbage collection (docs/archive.md § Artifact retention): the blobs of archived jobs
that finished more than ``older_than_days`` ago are deleted from the artifact store, never a blob
another job still refers to.

Artifacts are content-addressed (``statecore.artifacts``): one image submitted twice is one file, so
a blob is deleted only when no job outside the collected ones refers to it: not a job Redis holds
(live, or finished within its retention), not an archived job that finished more recently. A blob
written or re-submitted within ``GRACE_S`` is also kept (``ArtifactStore.put`` renews the file's
time when the same bytes arrive again: an upload that reuses an old job's image is between its
``put`` and its job's creation). The archive's rows stay: the record keeps the names, and a read
of a collected blob answers 404 ``ARTIFACT_NOT_FOUND``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from hitl_review.statecore import keys
from hitl_review.statecore.artifacts import ArtifactStore
from hitl_review.statecore.errors import JobNotFound
from hitl_review.statecore.store import Store

from .archiver import artifact_name
from .db import Archive
from .schema import ArchivedJob, ArtifactRef

log = logging.getLogger("hitl.archive.gc")
GRACE_S = 3600.0


@dataclass
class Collected:
    """What one collection found and did."""

    older_than_days: float
    dry_run: bool
    jobs: int = 0  # archived jobs past the age
    candidates: int = 0  # distinct blobs they refer to
    shared: int = 0  # kept: another (live or newer) job refers to them too
    recent: int = 0  # kept: written within the grace period
    missing: int = 0  # already gone from the store
    deleted: list[str] = field(default_factory=list)  # deleted (with dry_run: would be)

    def as_dict(self) -> dict[str, object]:
        return {**self.__dict__, "deleted": len(self.deleted), "names": self.deleted[:1000]}


def _archived_names(archive: Archive, before: datetime) -> tuple[int, set[str], set[str]]:
    """(old jobs, the blobs they refer to, the blobs newer archived jobs refer to)."""
    with archive.reading() as s:
        old = select(ArchivedJob.job_id).where(ArchivedJob.finished_ts < before)
        n = s.scalar(select(func.count()).select_from(old.subquery())) or 0
        mine = set(s.scalars(select(ArtifactRef.name).where(ArtifactRef.job_id.in_(old))))
        others = set(s.scalars(select(ArtifactRef.name).where(ArtifactRef.job_id.not_in(old))))
    return n, mine, others


async def live_names(store: Store) -> set[str]:
    """Every blob a job Redis holds refers to (its image, its masks and cut-outs)."""
    names: set[str] = set()
    for p in range(keys.PARTITIONS):
        for job_id in await store.r.zrange(keys.jobs(p), 0, -1):
            try:
                state = await store.get(job_id)
            except JobNotFound:
                continue  # expired since the listing was read
            names.add(artifact_name(state.image.url))
            for s in state.results:
                names.update(artifact_name(u) for u in (s.mask_url, s.cutout_url) if u)
    return names


async def collect(
    store: Store, archive: Archive, artifacts: ArtifactStore, older_than_days: float, *, dry_run: bool = False
) -> Collected:
    """Delete the blobs only archived jobs finished more than ``older_than_days`` ago refer to."""
    done = Collected(older_than_days=older_than_days, dry_run=dry_run)
    before = datetime.now(UTC) - timedelta(days=older_than_days)
    done.jobs, mine, others = await asyncio.to_thread(_archived_names, archive, before)
    done.candidates = len(mine)
    keep = others | await live_names(store)
    fresh_after = time.time() - GRACE_S
    for name in sorted(mine):
        if name in keep:
            done.shared += 1
            continue
        modified = await asyncio.to_thread(artifacts.modified, name)
        if modified is None:
            done.missing += 1
        elif modified > fresh_after:
            done.recent += 1
        else:
            if not dry_run:
                await asyncio.to_thread(artifacts.delete, name)
            done.deleted.append(name)
    log.warning(
        "artifact gc (older than %.1f days%s): %d jobs, %d blobs, %d deleted, %d shared, %d recent, %d missing",
        older_than_days,
        ", dry run" if dry_run else "",
        done.jobs,
        done.candidates,
        len(done.deleted),
        done.shared,
        done.recent,
        done.missing,
    )
    return done
