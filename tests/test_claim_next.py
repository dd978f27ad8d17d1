"""``POST /claims/next`` (docs/protocol.md § Claims): "next job" claimed in one request, against a real
redis-server, through the ASGI app and the client, and reviewers racing for it in the store itself.

The server walks the queue oldest first and claims with claim.lua, which alone decides a race: every
reviewer racing gets a job of their own, none gets a job another holds, and a retried request renews
the claim it took instead of taking a second job."""

from __future__ import annotations

import asyncio

import pytest

from harness.tokens import TOKENS, auth
from hitl_review.client import AsyncHitlClient
from hitl_review.statecore.models import ClaimedJob
from hitl_review.statecore.next_claim import claim_next
from hitl_review.statecore.store import StoreConfig

from .asgi_util import BASE_URL, asgi_client, asgi_transport
from .helpers import footprint, iv, waiting_job

NEXT = "/api/v1/claims/next"


@pytest.fixture
async def api(store, redis_server, tmp_path):
    async with asgi_client(redis_server.url, tmp_path, StoreConfig(retention_s=3600, claim_ttl_s=60.0)) as c:
        yield c


async def test_the_oldest_waiting_job_is_claimed_and_answered_with_its_snapshot(api, store, image):
    older = await waiting_job(store, image)
    newer = await waiting_job(store, image)
    before = await footprint(store, older)
    r = await api.post(NEXT, json={}, headers=auth("rev1"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"reviewer", "claimed_at", "expires_at", "snapshot"}  # as POST …/claim?snapshot=true
    assert body["reviewer"] == "rev1" and body["snapshot"]["job_id"] == older
    got = await api.get(f"/api/v1/jobs/{older}", headers=auth("rev1"))
    assert body["snapshot"] == got.json()
    assert body["snapshot"]["claim"] == {"reviewer": "rev1", "expires_at": body["expires_at"]}
    assert await footprint(store, older) == before  # a claim is not a change of the job

    # rev2 is passed over rev1's claim to the next job; rev1 asking again (a retry) renews its own.
    second = await api.post(NEXT, headers=auth("rev2"))
    assert second.status_code == 200 and second.json()["snapshot"]["job_id"] == newer
    again = await api.post(NEXT, json={"exclude": []}, headers=auth("rev1"))
    assert again.json()["snapshot"]["job_id"] == older and again.json()["claimed_at"] == body["claimed_at"]

    # The job on rev1's page left out, nothing else is free: 204, and rev1 still holds its claim.
    none = await api.post(NEXT, json={"exclude": [older]}, headers=auth("rev1"))
    assert none.status_code == 204 and none.content == b""
    assert (await store.claim_of(older)).reviewer == "rev1"


async def test_a_job_whose_review_ended_or_that_was_skipped_is_passed_over(api, store, image):
    decided = await waiting_job(store, image)
    skipped = await waiting_job(store, image)
    last = await waiting_job(store, image)
    st = await store.get(decided)
    assert (await store.intervene(decided, iv(st, []), "rev2")).status_code == 200  # no longer waiting
    await store.skip(skipped, "rev1", 600)
    r = await api.post(NEXT, headers=auth("rev1"))
    assert r.status_code == 200 and r.json()["snapshot"]["job_id"] == last
    assert await store.claim_of(skipped) is None  # skipping is rev1's: nobody claimed it for them


async def test_bad_bodies_and_roles_are_refused_and_claim_nothing(api, store, image):
    job_id = await waiting_job(store, image)
    for body in ({"exclude": "job_x"}, {"exclude": [1, 2]}, {"limit": 3}, {"exclude": ["j"] * 51}):
        r = await api.post(NEXT, json=body, headers=auth("rev1"))
        assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST", (body, r.text)
    assert (await api.post(NEXT, headers=auth("sub1"))).status_code == 403
    assert (await api.post(NEXT)).status_code == 401
    assert await store.claim_of(job_id) is None


async def test_reviewers_racing_each_get_a_job_of_their_own(store, image):
    jobs = [await waiting_job(store, image) for _ in range(6)]
    reviewers = [f"racer{i}" for i in range(8)]  # two more than there are jobs
    taken = await asyncio.gather(*(claim_next(store, who) for who in reviewers))
    won = {t.snapshot.job_id: t.reviewer for t in taken if t is not None}
    assert sorted(won) == sorted(jobs)  # every job claimed once, by one reviewer
    assert sum(t is None for t in taken) == 2
    for job_id, who in won.items():
        assert (await store.claim_of(job_id)).reviewer == who


async def test_the_client_claims_the_next_job_or_answers_none(store, redis_server, tmp_path, image):
    job_id = await waiting_job(store, image)
    async with asgi_transport(redis_server.url, tmp_path) as transport:
        rev1 = AsyncHitlClient(BASE_URL, TOKENS["rev1"], transport=transport)
        rev2 = AsyncHitlClient(BASE_URL, TOKENS["rev2"], transport=transport)
        try:
            taken = await rev1.claim_next()
            assert isinstance(taken, ClaimedJob) and taken.snapshot.job_id == job_id
            assert taken.snapshot.active_pause is not None and taken.snapshot.claim is not None
            assert await rev2.claim_next() is None  # rev1 holds the only one
            assert await rev1.claim_next(exclude=[job_id]) is None
        finally:
            await rev1.aclose()
            await rev2.aclose()
