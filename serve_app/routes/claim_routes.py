"""The review-claim routes (docs/protocol.md § Claims): ``POST`` and ``DELETE /jobs/{id}/claim``, and
``POST /claims/next`` (the next job, claimed: ``statecore.next_claim``).

Reviewer role (the role table is ``serve_app.routes.api.ROUTE_ROLES``). A claim only says who is looking
at a waiting job; the intervention gates never consult it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from hitl_review.statecore.models import Claim, ClaimedJob, ClaimReleased
from hitl_review.statecore.next_claim import claim_next
from hitl_review.statecore.store import Store

log = logging.getLogger("hitl.api")

API = "/api/v1"
CLAIM_PATH = f"{API}/jobs/{{job_id}}/claim"
NEXT_PATH = f"{API}/claims/next"
CLAIM_409 = (
    'CLAIMED_BY_OTHER {"code", "message", "claim": {"reviewer", "expires_at"}, "snapshot"} unless force=true; '
    "PAUSE_NOT_ACTIVE, JOB_CANCELLED or JOB_TERMINAL when no review waits"
)


class NextClaimRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # the jobs not to take (the one on the page): a few ids, never the queue
    exclude: list[str] = Field(default_factory=list, max_length=50)


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

    @app.post(
        NEXT_PATH,
        response_model=ClaimedJob,
        responses={204: {"description": "no waiting job is left for the caller to claim"}, 400: {}},
    )
    async def next_claim(request: Request, body: NextClaimRequest | None = None) -> ClaimedJob | Response:
        """Claim the oldest waiting job nobody else claimed (other than ``exclude``) and answer it as
        ``POST /jobs/{id}/claim?snapshot=true`` does; 204 when none is left. "Next job" in one round trip
        however many reviewers race for the same jobs: a job another claimed first is passed over here."""
        reviewer = request.state.identity.name
        taken = await claim_next(store_of(), reviewer, body.exclude if body is not None else ())
        if taken is None:
            return Response(status_code=204)
        return taken
