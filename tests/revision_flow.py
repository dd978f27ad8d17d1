"""Reaching a round-two pause through the store, for the state-core tests of round two and retention."""

from __future__ import annotations

import json

from .helpers import iv, keep, manual, validate, waiting_job


async def to_revision(store, image, keep_model: bool):
    """Round 1 with a passing and a failing manual box -> round-2 pause."""
    job_id = await waiting_job(store, image)
    st1 = await store.get(job_id)
    subjects = (keep(st1, 0) if keep_model else []) + [
        manual([300, 300, 400, 400], "ok"),
        manual([500, 300, 600, 400], "bad"),
    ]
    body = json.loads((await store.intervene(job_id, iv(st1, subjects), "rev")).body)
    good, bad = body["diff"]["added"]
    assert await validate(store, job_id, {good: True, bad: False}) == "OK"
    return job_id, st1, good, bad
