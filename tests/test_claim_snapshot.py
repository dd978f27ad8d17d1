"""``POST /jobs/{id}/claim?snapshot=true`` (docs/protocol.md § Claims): the claim and the job's fresh
snapshot in one round trip, against a real redis-server through the ASGI app (as tests/test_claims.py)."""

from __future__ import annotations

import pytest

from harness.tokens import TOKENS, auth
from hitl_review.client import AsyncHitlClient, ConflictError
from hitl_review.statecore.models import Claim, ClaimedJob
from hitl_review.statecore.store import StoreConfig

from .asgi_util import BASE_URL, asgi_client, asgi_transport
from .helpers import footprint, iv, waiting_job


@pytest.fixture
async def api(store, redis_server, tmp_path):
    async with asgi_client(redis_server.url, tmp_path, StoreConfig(retention_s=3600, claim_ttl_s=60.0)) as c:
        yield c


def claim_path(job_id: str) -> str:
    return f"/api/v1/jobs/{job_id}/claim"


async def test_the_claim_carries_the_snapshot_as_get_shows_it_after_the_claim(api, store, image):
    job_id = await waiting_job(store, image)
    before = await footprint(store, job_id)
    r = await api.post(claim_path(job_id), params={"snapshot": "true"}, headers=auth("rev1"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"reviewer", "claimed_at", "expires_at", "snapshot"}  # the claim's fields are kept
    assert body["reviewer"] == "rev1"
    got = await api.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1"))
    assert body["snapshot"] == got.json()  # the same JSON as GET, with the claim just taken
    assert body["snapshot"]["claim"] == {"reviewer": "rev1", "expires_at": body["expires_at"]}
    assert body["snapshot"]["active_pause"]["pause_token"] == before["meta"]["pause_token"]
    assert await footprint(store, job_id) == before  # still not a change of the job
    # snapshot=false (or none) answers the claim alone, as before
    plain = await api.post(claim_path(job_id), params={"snapshot": "false"}, headers=auth("rev1"))
    assert set(plain.json()) == {"reviewer", "claimed_at", "expires_at"}


async def test_refusals_are_the_claims_own_with_snapshot_asked(api, store, image):
    job_id = await waiting_job(store, image)
    await api.post(claim_path(job_id), headers=auth("rev1"))
    r = await api.post(claim_path(job_id), params={"snapshot": "true"}, headers=auth("rev2"))
    assert r.status_code == 409 and r.json()["code"] == "CLAIMED_BY_OTHER"
    assert r.json()["snapshot"]["claim"]["reviewer"] == "rev1"
    st = await store.get(job_id)
    assert (await store.intervene(job_id, iv(st, []), "rev1")).status_code == 200  # the pause is consumed
    r = await api.post(claim_path(job_id), params={"snapshot": "true"}, headers=auth("rev2"))
    assert r.status_code == 409 and r.json()["code"] == "JOB_TERMINAL"
    bad = await api.post(claim_path(job_id), params={"snapshot": "perhaps"}, headers=auth("rev2"))
    assert bad.status_code == 400 and "snapshot" in bad.json()["message"]


async def test_the_client_asks_for_the_snapshot_with_the_claim(store, redis_server, tmp_path, image):
    job_id = await waiting_job(store, image)
    async with asgi_transport(redis_server.url, tmp_path) as transport:
        rev1 = AsyncHitlClient(BASE_URL, TOKENS["rev1"], transport=transport)
        rev2 = AsyncHitlClient(BASE_URL, TOKENS["rev2"], transport=transport)
        try:
            taken = await rev1.claim(job_id, snapshot=True)
            assert isinstance(taken, ClaimedJob) and taken.reviewer == "rev1"
            assert taken.snapshot.job_id == job_id and taken.snapshot.claim is not None
            assert taken.snapshot.claim.reviewer == "rev1" and taken.snapshot.active_pause is not None
            renewed = await rev1.claim(job_id)
            assert type(renewed) is Claim and renewed.claimed_at == taken.claimed_at
            with pytest.raises(ConflictError) as ei:
                await rev2.claim(job_id, snapshot=True)
            assert ei.value.code == "CLAIMED_BY_OTHER" and ei.value.claim is not None
        finally:
            await rev1.aclose()
            await rev2.aclose()
