"""The preview route (docs/protocol.md § Cut-out quality): ``POST /jobs/{id}/subjects/{box_id}/preview``.

Reviewer role. A mask for the subject's box plus the reviewer's points, from the segmenter (on Ray
Serve a Segmenter replica, SAM's image embedding from its cache), with the quality gate's verdict:
something to look at while reviewing. Nothing is written: no version, no event, no audit entry.
Each reviewer may ask ``RATE`` times a second (a burst of ``BURST``) per Api replica; beyond that 429
``RATE_LIMITED`` with ``Retry-After``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from hitl_review.statecore import errors
from hitl_review.statecore.models import ImageRef, JobSnapshot, QualityVerdict

log = logging.getLogger("hitl.api")

API = "/api/v1"
PREVIEW_PATH = f"{API}/jobs/{{job_id}}/subjects/{{box_id}}/preview"
RATE = 5.0  # previews per second per reviewer (a click each)
BURST = 10
MAX_POINTS = 32

Previewer = Callable[[ImageRef, list[float], list[dict[str, Any]]], Awaitable[dict[str, Any]]]


class PreviewPoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    x: float
    y: float
    positive: StrictBool

    @field_validator("x", "y")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number of pixels")
        return v


class PreviewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    points: list[PreviewPoint] = Field(min_length=1, max_length=MAX_POINTS)


class PreviewResponse(BaseModel):
    box_id: str
    mask_png_base64: str  # a PNG of the image's size, 255 inside the mask
    area: int  # pixels in the mask
    quality: QualityVerdict | None  # the gate's verdict on it (None: the gate is off)
    ms: float  # the segmenter's time for it


class RateLimiter:
    """A token bucket per reviewer (this process's): ``take`` answers the seconds to wait, 0 when allowed."""

    def __init__(self, rate: float = RATE, burst: int = BURST, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.buckets: dict[str, tuple[float, float]] = {}  # reviewer -> (tokens, at)

    def take(self, who: str) -> float:
        now = self.clock()
        tokens, at = self.buckets.get(who, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens < 1:
            self.buckets[who] = (tokens, now)
            return (1 - tokens) / self.rate
        self.buckets[who] = (tokens - 1, now)
        return 0.0


def add_preview_route(
    app: FastAPI,
    located: Callable[[Request, str], Awaitable[tuple[JobSnapshot, Any]]],
    previewer_of: Callable[[], Previewer | None],
    limiter: RateLimiter | None = None,
) -> None:
    limits = limiter or RateLimiter()

    @app.post(
        PREVIEW_PATH,
        response_model=PreviewResponse,
        responses={400: {}, 404: {}, 429: {"description": "RATE_LIMITED"}, 503: {}},
    )
    async def preview(request: Request, job_id: str, box_id: str, body: PreviewRequest) -> PreviewResponse:
        """A mask for ``box_id``'s box and the points (``positive`` true: the subject, false: not), with
        the quality gate's verdict; the job does not change."""
        snap, _ = await located(request, job_id)
        box = next((b for b in snap.box_list if b.box_id == box_id), None)
        if box is None:
            raise errors.InvalidRequest(f"box {box_id} is not in the job's box list", job_id=job_id)
        reviewer = request.state.identity.name
        wait = limits.take(reviewer)
        if wait > 0:
            raise errors.RateLimited(f"more than {RATE:g} previews a second; wait {wait:.1f} s", job_id=job_id)
        previewer = previewer_of()
        if previewer is None:
            raise errors.PreviewUnavailable("no segmenter with a prompted path serves previews here")
        try:
            result = await previewer(snap.image, list(box.bbox), [p.model_dump() for p in body.points])
        except ValueError as e:  # a point off the image: the segmenter's own words (Ray's error wraps them)
            raise errors.InvalidRequest(str(getattr(e, "cause", None) or e), job_id=job_id) from None
        except (LookupError, errors.NodeExecutionError) as e:  # no prompted path; the image unreadable
            raise errors.PreviewUnavailable(str(getattr(e, "cause", None) or e)) from None
        log.debug("preview job=%s box=%s reviewer=%s %s ms", job_id, box_id, reviewer, result.get("ms"))
        return PreviewResponse(box_id=box_id, **result)
