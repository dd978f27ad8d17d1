"""Review claims (docs/protocol.md § Claims): who is looking at a waiting job. A mixin of
:class:`statecore.store.Store`.

A claim is soft and apart from the job: a HASH with a TTL in the job's partition
(``keys.JobKeys.claim``), taken, renewed, taken over and released by claim.lua, ended by
consume_pause.lua and cancel.lua. It never changes the job's version, and its expiry never touches
the pause. The intervention gates do not look at it.
"""

from __future__ import annotations

import time
from typing import Any

from . import errors, keys, scripts
from .ids import now_iso
from .jobstate import JobState
from .models import Claim, ClaimView


def _snapshot_of(meta: dict[str, str]) -> dict[str, Any] | None:
    return JobState.from_meta(meta).snapshot().model_dump(mode="json") if meta else None


class ClaimsMixin:
    r: Any
    _scripts: dict[str, Any]
    config: Any  # statecore.store.StoreConfig: claim_ttl_s

    async def claim_of(self, job_id: str) -> ClaimView | None:
        reviewer, expires_at = await self.r.hmget(keys.job(job_id).claim, "reviewer", "expires_at")
        return ClaimView(reviewer=reviewer, expires_at=expires_at) if reviewer and expires_at else None

    async def claims_of(self, job_ids: list[str]) -> list[ClaimView | None]:
        """Several jobs' claims in one pipeline (one pooled connection, one round trip)."""
        async with self.r.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hmget(keys.job(job_id).claim, "reviewer", "expires_at")
            rows = await pipe.execute()
        return [ClaimView(reviewer=rv, expires_at=ex) if rv and ex else None for rv, ex in rows]

    async def with_claim(self, e: errors.HitlError) -> errors.HitlError:
        """A 409's snapshot as GET shows it: with the claim the script's HGETALL of meta leaves out."""
        if e.snapshot is not None and e.job_id and "claim" not in e.snapshot:
            view = await self.claim_of(e.job_id)
            e.snapshot["claim"] = view.model_dump() if view else None
        return e

    async def _claim_script(self, job_id: str, op: str, reviewer: str, force: bool) -> list[Any]:
        now = time.time()
        ttl_ms = max(1, int(self.config.claim_ttl_s * 1000))
        res: list[Any] = await self._scripts["claim"](
            keys=keys.job(job_id).for_script(),
            args=[
                job_id,
                now_iso(now),
                0,
                reviewer,
                op,
                reviewer,
                ttl_ms,
                "1" if force else "0",
                now_iso(now + ttl_ms / 1000),
            ],
        )
        if res[0] not in ("OK", "RELEASED", "NONE"):
            try:
                scripts.raise_for(res, job_id, _snapshot_of)
            except errors.HitlError as e:
                raise await self.with_claim(e) from None
        return res

    async def claim(self, job_id: str, reviewer: str, *, force: bool = False) -> Claim:
        """Take or renew ``reviewer``'s claim on the waiting job; with ``force``, take another
        reviewer's over (a ``CLAIM_TAKEN_OVER`` event names both). 409 ``CLAIMED_BY_OTHER``
        otherwise, and ``JOB_CANCELLED``/``JOB_TERMINAL``/``PAUSE_NOT_ACTIVE`` when no review waits."""
        res = await self._claim_script(job_id, "claim", reviewer, force)
        return Claim(reviewer=res[1], claimed_at=res[2], expires_at=res[3])

    async def release_claim(self, job_id: str, reviewer: str) -> bool:
        """Release ``reviewer``'s claim: True if it held one, False if there was none; another
        reviewer's claim is a 409 ``CLAIMED_BY_OTHER`` (only its holder releases a claim)."""
        res = await self._claim_script(job_id, "release", reviewer, False)
        return bool(res[0] == "RELEASED")
