"""The review-claim routes (docs/protocol.md § Claims): ``POST`` and ``DELETE /jobs/{id}/claim``.

Reviewer role (the role table is ``serve_app.api.ROUTE_ROLES``). A claim only says who is looking
at a waiting job; the intervention gates never consult it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Query, Request

from hitl_review.statecore.models import Claim, ClaimedJob, ClaimReleased
from hitl_review.statecore.store import Store

log = logging.getLogger("hitl.api")

API = "/api/v1"
CLAIM_PATH = f"{API}/jobs/{{job_id}}/claim"
CLAIM_409 = (
    'CLAIMED_BY_OTHER {"code", "message", "claim": {"reviewer", "expires_at"}, "snapshot"} unless force=true; '
    "PAUSE_NOT_ACTIVE, JOB_CANCELLED or JOB_TERMINAL when no review waits"
)


def add_claim_routes(app: FastAPI, store_of: Callable[[], Store]) -> None:
    @app.post(
        CLAIM_PATH, response_model=ClaimedJob | Claim, responses={400: {}, 404: {}, 409: {"description": CLAIM_409}}
    )
    async def claim(
        request: Request,
        job_id: str,
        force: bool = Query(
            default=False, description="take over another reviewer's claim (recorded as a CLAIM_TAKEN_OVER event)"
        ),
        snapshot: bool = Query(
            default=False, description="answer the job's snapshot too, read right after the claim was taken"
        ),
    ) -> ClaimedJob | Claim:
        """Take or renew the caller's claim on a waiting job; ``expires_at`` moves with every renewal.
        With ``snapshot=true`` the answer also carries the job as ``GET /jobs/{id}`` shows it just after
        (its ``claim`` the one taken, unless it ended in between): opening a job is one round trip."""
        reviewer = request.state.identity.name
        store = store_of()
        taken = await store.claim(job_id, reviewer, force=force)
        if force:
            log.info("claim job=%s reviewer=%s (force)", job_id, reviewer)
        if not snapshot:
            return taken
        return ClaimedJob(**taken.model_dump(), snapshot=await store.snapshot(job_id))

    @app.delete(
        CLAIM_PATH,
        response_model=ClaimReleased,
        responses={404: {}, 409: {"description": "CLAIMED_BY_OTHER: another reviewer's claim is not yours to release"}},
    )
    async def release(request: Request, job_id: str) -> ClaimReleased:
        """Release the caller's claim; ``released`` is false when there was none."""
        released = await store_of().release_claim(job_id, request.state.identity.name)
        return ClaimReleased(job_id=job_id, released=released)
