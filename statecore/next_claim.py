"""The next job for a reviewer, claimed in one call (docs/protocol.md § Claims, ``POST /claims/next``).

"Next job" used to be two requests from the page, the queue's first unclaimed job and then its claim,
asked again whenever another reviewer claimed it in between: with four reviewers racing for the same
job on a busy machine that was two to six round trips per N. Here the walk down the queue happens
next to the store: the oldest waiting job nobody else claimed (``Store.list_jobs`` with
``unclaimed_for``: quorum jobs the reviewer voted on and jobs they skipped are left out too) is
claimed by claim.lua, which alone decides a race; a job another reviewer took first, or whose pause
ended in between, is passed over for the next one. The caller's own claim does not hide a job, so a
retried request renews the claim it already took instead of taking a second job.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from . import errors
from .models import ClaimedJob

if TYPE_CHECKING:
    from .store import Store

PAGE = 20  # queue entries read per page
MOST_PAGES = 5  # at most this many pages walked (100 jobs) before answering that none could be claimed
# a job another reviewer claimed first, whose review ended in between, or whose records expired: try the next
PASSED_OVER = (
    errors.ClaimedByOther,
    errors.PauseNotActive,
    errors.JobCancelled,
    errors.JobTerminal,
    errors.JobNotFound,
)


async def claim_next(store: Store, reviewer: str, exclude: Iterable[str] = ()) -> ClaimedJob | None:
    """Claim the oldest waiting job ``reviewer`` may take, other than ``exclude``; its claim and its
    snapshot read right after (as ``POST /jobs/{id}/claim?snapshot=true``), or None when none is left."""
    skip = set(exclude)
    cursor: str | None = None
    for _ in range(MOST_PAGES):
        jobs, cursor = await store.list_jobs(status="WAITING", limit=PAGE, cursor=cursor, unclaimed_for=reviewer)
        for job in jobs:
            if job.job_id in skip:
                continue
            try:
                taken = await store.claim(job.job_id, reviewer)
            except PASSED_OVER:
                continue
            return ClaimedJob(**taken.model_dump(), snapshot=await store.snapshot(job.job_id))
        if cursor is None:
            break
    return None
