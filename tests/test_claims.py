"""Review claims (docs/protocol.md § Claims) against a real redis-server, through the ASGI app, and
the claim script on the 3-node Redis Cluster.

A claim is soft: it never moves the job's version, never touches the pause, expires by itself,
and is ended by a submission or a cancel. Jobs are driven to their pause through the store."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime

import pytest

from harness.tokens import TOKENS, auth
from hitl_review.client import AsyncHitlClient, ConflictError
from hitl_review.client.times import parse_time
from hitl_review.statecore import keys
from hitl_review.statecore.errors import ClaimedByOther, PauseNotActive
from hitl_review.statecore.store import StoreConfig

from .asgi_util import BASE_URL, asgi_client, asgi_transport
from .helpers import create, footprint, iv, keep, waiting_job

TTL_S = 60.0


@pytest.fixture
async def api(store, redis_server, tmp_path):
    async with asgi_client(redis_server.url, tmp_path, StoreConfig(retention_s=3600, claim_ttl_s=TTL_S)) as c:
        yield c


def claim_path(job_id: str) -> str:
    return f"/api/v1/jobs/{job_id}/claim"


async def snap(api, job_id: str, who: str = "rev1") -> dict:
    r = await api.get(f"/api/v1/jobs/{job_id}", headers=auth(who))
    assert r.status_code == 200, r.text
    return r.json()


def seconds_between(a: str, b: str) -> float:
    ta, tb = parse_time(a), parse_time(b)
    assert isinstance(ta, datetime) and isinstance(tb, datetime)
    return (tb - ta).total_seconds()


async def test_claim_answers_reviewer_and_times_and_changes_nothing_of_the_job(api, store, image):
    job_id = await waiting_job(store, image)
    before = await footprint(store, job_id)
    r = await api.post(claim_path(job_id), headers=auth("rev1"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"reviewer", "claimed_at", "expires_at"}
    assert body["reviewer"] == "rev1"
    assert seconds_between(body["claimed_at"], body["expires_at"]) == pytest.approx(TTL_S, abs=0.01)
    # Not a change of the job: meta (version, pause), pause history, events, outbox all as they were.
    assert await footprint(store, job_id) == before
    s = await snap(api, job_id)
    assert s["claim"] == {"reviewer": "rev1", "expires_at": body["expires_at"]}
    ttl_ms = await store.r.pttl(keys.job(job_id).claim)
    assert 0 < ttl_ms <= TTL_S * 1000


async def test_renewal_keeps_claimed_at_and_moves_expires_at(api, store, image):
    job_id = await waiting_job(store, image)
    first = (await api.post(claim_path(job_id), headers=auth("rev1"))).json()
    await asyncio.sleep(0.02)
    version = (await snap(api, job_id))["version"]
    again = await api.post(claim_path(job_id), headers=auth("rev1"))
    assert again.status_code == 200
    second = again.json()
    assert second["claimed_at"] == first["claimed_at"]
    assert seconds_between(first["expires_at"], second["expires_at"]) > 0
    assert (await snap(api, job_id))["version"] == version


async def test_another_reviewers_claim_is_409_with_the_claim_and_the_snapshot(api, store, image):
    job_id = await waiting_job(store, image)
    mine = (await api.post(claim_path(job_id), headers=auth("rev1"))).json()
    before = await footprint(store, job_id)
    r = await api.post(claim_path(job_id), headers=auth("rev2"))
    assert r.status_code == 409
    body = r.json()
    assert body["code"] == "CLAIMED_BY_OTHER" and body["message"]
    assert body["claim"] == {"reviewer": "rev1", "expires_at": mine["expires_at"]}
    assert body["snapshot"]["job_id"] == job_id
    assert body["snapshot"]["claim"] == body["claim"]
    assert body["snapshot"]["active_pause"]["pause_token"] == before["meta"]["pause_token"]
    assert await footprint(store, job_id) == before
    assert (await snap(api, job_id))["claim"]["reviewer"] == "rev1"
    # force=false is the same as no force
    assert (await api.post(claim_path(job_id) + "?force=false", headers=auth("rev2"))).status_code == 409


async def test_force_takes_the_claim_over_records_it_and_keeps_the_version(api, store, image):
    job_id = await waiting_job(store, image)
    first = (await api.post(claim_path(job_id), headers=auth("rev1"))).json()
    version = (await snap(api, job_id))["version"]
    r = await api.post(claim_path(job_id) + "?force=true", headers=auth("rev2"))
    assert r.status_code == 200, r.text
    assert r.json()["reviewer"] == "rev2"
    s = await snap(api, job_id)
    assert s["version"] == version and s["claim"]["reviewer"] == "rev2"
    taken = [e for e in await store.events_after(job_id) if e.type == "CLAIM_TAKEN_OVER"]
    assert len(taken) == 1
    assert taken[0].data["reviewer"] == "rev2" and taken[0].data["from_reviewer"] == "rev1"
    assert taken[0].data["from_expires_at"] == first["expires_at"]
    assert taken[0].version == version
    # now rev1 is the other one
    back = await api.post(claim_path(job_id), headers=auth("rev1"))
    assert back.status_code == 409 and back.json()["claim"]["reviewer"] == "rev2"
    # a forced claim on a job nobody holds records nothing
    other = await waiting_job(store, image)
    assert (await api.post(claim_path(other) + "?force=true", headers=auth("rev1"))).status_code == 200
    assert not [e for e in await store.events_after(other) if e.type == "CLAIM_TAKEN_OVER"]


async def test_release_only_by_the_holder_and_idempotent(api, store, image):
    job_id = await waiting_job(store, image)
    await api.post(claim_path(job_id), headers=auth("rev1"))
    refused = await api.delete(claim_path(job_id), headers=auth("rev2"))
    assert refused.status_code == 409 and refused.json()["code"] == "CLAIMED_BY_OTHER"
    assert refused.json()["claim"]["reviewer"] == "rev1"
    assert (await snap(api, job_id))["claim"]["reviewer"] == "rev1"
    r = await api.delete(claim_path(job_id), headers=auth("rev1"))
    assert r.status_code == 200 and r.json() == {"job_id": job_id, "released": True}
    assert (await snap(api, job_id))["claim"] is None
    again = await api.delete(claim_path(job_id), headers=auth("rev1"))
    assert again.status_code == 200 and again.json()["released"] is False
    # released: anyone may claim without force
    assert (await api.post(claim_path(job_id), headers=auth("rev2"))).status_code == 200


async def test_a_claim_expires_by_itself_and_never_touches_the_pause(store, redis_server, tmp_path, image):
    short = StoreConfig(retention_s=3600, claim_ttl_s=0.3)
    async with asgi_client(redis_server.url, tmp_path, short) as api:
        job_id = await waiting_job(store, image)
        before = await footprint(store, job_id)
        assert (await api.post(claim_path(job_id), headers=auth("rev1"))).status_code == 200
        assert (await api.post(claim_path(job_id), headers=auth("rev2"))).status_code == 409
        deadline = time.monotonic() + 5
        while (await snap(api, job_id))["claim"] is not None:
            assert time.monotonic() < deadline, "the claim did not expire"
            await asyncio.sleep(0.05)
        assert await footprint(store, job_id) == before  # same version, same pause, same token
        assert (await api.post(claim_path(job_id), headers=auth("rev2"))).status_code == 200


async def test_submitting_releases_the_claim(api, store, image):
    job_id = await waiting_job(store, image)
    await api.post(claim_path(job_id), headers=auth("rev1"))
    st = await store.get(job_id)
    reply = await store.intervene(job_id, iv(st, keep(st, 0, 1)), "rev1")
    assert reply.status_code == 200
    assert await store.r.exists(keys.job(job_id).claim) == 0
    assert (await snap(api, job_id))["claim"] is None


async def test_a_submission_without_the_claim_is_judged_by_the_gates_alone(api, store, image):
    job_id = await waiting_job(store, image)
    await api.post(claim_path(job_id), headers=auth("rev1"))
    s = await snap(api, job_id, "rev2")
    body = {
        "intervention_id": f"iv_{uuid.uuid4().hex[:12]}",
        "pause_token": s["active_pause"]["pause_token"],
        "base_version": s["version"],
        "subjects": [{"box_id": s["box_list"][0]["box_id"], "bbox": s["box_list"][0]["bbox"]}],
    }
    r = await api.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=auth("rev2"))
    assert r.status_code == 200, r.text
    assert (await snap(api, job_id))["claim"] is None


async def test_cancelling_releases_the_claim(api, store, image):
    job_id = await waiting_job(store, image)
    await api.post(claim_path(job_id), headers=auth("rev1"))
    r = await api.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth("rev2"))
    assert r.status_code == 200 and r.json()["claim"] is None
    assert await store.r.exists(keys.job(job_id).claim) == 0


async def test_only_a_waiting_job_can_be_claimed(api, store, image):
    detecting = await create(store, image)
    r = await api.post(claim_path(detecting), headers=auth("rev1"))
    assert r.status_code == 409 and r.json()["code"] == "PAUSE_NOT_ACTIVE"
    assert r.json()["snapshot"]["status"] == "DETECTING" and r.json()["snapshot"]["claim"] is None
    cancelled = await waiting_job(store, image)
    await store.cancel(cancelled, "rev1")
    r = await api.post(claim_path(cancelled), headers=auth("rev1"))
    assert r.status_code == 409 and r.json()["code"] == "JOB_CANCELLED"
    ended = await waiting_job(store, image)
    st = await store.get(ended)
    assert (await store.intervene(ended, iv(st, []), "rev1")).status_code == 200  # EMPTY_SELECTION
    r = await api.post(claim_path(ended), headers=auth("rev1"))
    assert r.status_code == 409 and r.json()["code"] == "JOB_TERMINAL"
    assert r.json()["snapshot"]["status"] == "EMPTY_SELECTION"
    missing = await api.post(claim_path("job_doesnotexist"), headers=auth("rev1"))
    assert missing.status_code == 404 and missing.json()["code"] == "JOB_NOT_FOUND"
    assert (await api.delete(claim_path("job_doesnotexist"), headers=auth("rev1"))).status_code == 404
    assert await store.r.exists(keys.job(detecting).claim, keys.job(cancelled).claim, keys.job(ended).claim) == 0


def test_the_claim_key_is_in_the_jobs_partition():
    for n in range(50):
        jk = keys.job(f"job_{n:020x}")
        assert jk.claim.startswith(keys.tag(jk.p) + ":job:") and jk.claim.endswith(":claim")
        assert jk.claim in jk.for_script() and jk.claim != jk.meta


@pytest.mark.parametrize("force", ["maybe", "2", "", "truee"])
async def test_force_that_is_not_a_boolean_is_400_and_takes_nothing(api, store, image, force):
    job_id = await waiting_job(store, image)
    await api.post(claim_path(job_id), headers=auth("rev1"))
    before = await footprint(store, job_id)
    r = await api.post(claim_path(job_id), params={"force": force}, headers=auth("rev2"))
    assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST", r.text
    assert "force" in r.json()["message"]
    assert await footprint(store, job_id) == before
    assert (await snap(api, job_id))["claim"]["reviewer"] == "rev1"


async def test_claim_routes_are_for_reviewers(api, store, image):
    job_id = await waiting_job(store, image, submitter="sub1")
    for method in ("POST", "DELETE"):
        r = await api.request(method, claim_path(job_id), headers=auth("sub1"))
        assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
        assert (await api.request(method, claim_path(job_id))).status_code == 401
    assert (await api.post(claim_path(job_id), headers=auth("admin"))).status_code == 200


async def test_queue_summaries_carry_the_claim_and_next_skips_jobs_claimed_by_others(api, store, image):
    older = await waiting_job(store, image)
    await asyncio.sleep(0.005)  # distinct pause times: the queue is oldest first
    newer = await waiting_job(store, image)
    await api.post(claim_path(older), headers=auth("rev1"))

    queue = (await api.get("/api/v1/jobs", params={"status": "WAITING"}, headers=auth("rev2"))).json()["jobs"]
    by_id = {j["job_id"]: j for j in queue}
    assert by_id[older]["claim"]["reviewer"] == "rev1" and by_id[newer]["claim"] is None
    assert [j["job_id"] for j in queue] == [older, newer]
    everything = (await api.get("/api/v1/jobs", headers=auth("rev2"))).json()["jobs"]
    assert {j["job_id"]: j["claim"] for j in everything}[older]["reviewer"] == "rev1"

    # The next job for rev2: the oldest waiting one nobody else is looking at.
    params = {"status": "WAITING", "unclaimed": "true", "limit": 1}
    nxt = (await api.get("/api/v1/jobs", params=params, headers=auth("rev2"))).json()
    assert [j["job_id"] for j in nxt["jobs"]] == [newer]
    # rev1's own claim does not hide the job from rev1.
    mine = (await api.get("/api/v1/jobs", params=params, headers=auth("rev1"))).json()
    assert [j["job_id"] for j in mine["jobs"]] == [older]
    # Once the claim is gone the job is offered to everyone again.
    await api.delete(claim_path(older), headers=auth("rev1"))
    again = (await api.get("/api/v1/jobs", params=params, headers=auth("rev2"))).json()
    assert [j["job_id"] for j in again["jobs"]] == [older]
    bad = await api.get("/api/v1/jobs", params={"unclaimed": "perhaps"}, headers=auth("rev2"))
    assert bad.status_code == 400 and bad.json()["code"] == "INVALID_REQUEST"


async def test_paging_the_unclaimed_queue_is_exact(api, store, image):
    jobs = []
    for _ in range(7):
        jobs.append(await waiting_job(store, image))
        await asyncio.sleep(0.003)
    claimed = {jobs[1], jobs[4], jobs[5]}
    for j in claimed:
        assert (await api.post(claim_path(j), headers=auth("rev1"))).status_code == 200
    seen, cursor = [], None
    while True:
        params = {"status": "WAITING", "unclaimed": "true", "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await api.get("/api/v1/jobs", params=params, headers=auth("rev2"))).json()
        seen += [j["job_id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [j for j in jobs if j not in claimed]


# ----------------------------------------------------------------------------- the Python client


async def test_the_client_claims_renews_releases_and_finds_the_next_job(store, redis_server, tmp_path, image):
    older = await waiting_job(store, image)
    await asyncio.sleep(0.005)
    newer = await waiting_job(store, image)
    async with asgi_transport(redis_server.url, tmp_path) as transport:
        rev1 = AsyncHitlClient(BASE_URL, TOKENS["rev1"], transport=transport)
        rev2 = AsyncHitlClient(BASE_URL, TOKENS["rev2"], transport=transport)
        try:
            assert (await rev1.next_job()).job_id == older
            taken = await rev1.claim(older)
            assert taken.reviewer == "rev1" and (await rev1.claim(older)).claimed_at == taken.claimed_at
            with pytest.raises(ConflictError) as ei:
                await rev2.claim(older)
            assert ei.value.code == "CLAIMED_BY_OTHER"
            assert ei.value.claim is not None and ei.value.claim.reviewer == "rev1"
            assert ei.value.job_snapshot is not None and ei.value.job_snapshot.claim == ei.value.claim
            assert (await rev2.next_job()).job_id == newer
            assert await rev2.next_job(exclude=[newer]) is None
            assert (await rev1.next_job(exclude=[newer])).job_id == older  # its own claim
            page = await rev2.list_jobs("WAITING", unclaimed=True)
            assert [j.job_id for j in page.jobs] == [newer]
            assert (await rev2.claim(older, force=True)).reviewer == "rev2"
            assert await rev2.release(older) is True and await rev2.release(older) is False
            # a submission echoing the snapshot id, and a refused one's rebase
            snap = await rev1.get_job(newer)
            assert snap.active_pause is not None and snap.claim is None
            kept = [snap.box_list[0]]
            with pytest.raises(ConflictError) as bad:
                await rev1.intervene(
                    newer,
                    intervention_id="iv_client_1",
                    pause_token=snap.active_pause.pause_token,
                    base_version=snap.version,
                    subjects=kept,
                    snapshot_id="snap_" + "0" * 20,
                )
            assert bad.value.code == "SNAPSHOT_MISMATCH"
            assert bad.value.rebase is not None and bad.value.rebase["base_found"] is True
            done = await rev1.intervene(
                newer,
                intervention_id="iv_client_1",
                pause_token=snap.active_pause.pause_token,
                base_version=snap.version,
                subjects=kept,
                snapshot_id=snap.active_pause.snapshot_id,
            )
            assert done.accepted and done.version == snap.version + 1
        finally:
            await rev1.aclose()
            await rev2.aclose()


# ----------------------------------------------------------------------------- on a Redis Cluster


@pytest.mark.cluster
async def test_the_claim_script_on_a_redis_cluster(cluster_store, image):
    s = cluster_store
    s.config.claim_ttl_s = 30
    job_id = await waiting_job(s, image)
    version = (await s.get(job_id)).version
    c1 = await s.claim(job_id, "rev1")
    assert c1.reviewer == "rev1"
    assert (await s.claim(job_id, "rev1")).claimed_at == c1.claimed_at
    with pytest.raises(ClaimedByOther) as ei:
        await s.claim(job_id, "rev2")
    assert ei.value.to_body()["claim"]["reviewer"] == "rev1"
    assert ei.value.snapshot is not None and ei.value.snapshot["claim"]["reviewer"] == "rev1"
    assert (await s.claim(job_id, "rev2", force=True)).reviewer == "rev2"
    assert [e.type for e in await s.events_after(job_id)][-1] == "CLAIM_TAKEN_OVER"
    view = (await s.snapshot(job_id)).claim
    assert view is not None and view.reviewer == "rev2"
    assert await s.release_claim(job_id, "rev2") is True
    assert await s.release_claim(job_id, "rev2") is False
    await s.claim(job_id, "rev1")
    st = await s.get(job_id)
    assert st.version == version
    assert (await s.intervene(job_id, iv(st, keep(st, 0)), "rev1")).status_code == 200
    assert await s.claim_of(job_id) is None
    with pytest.raises(PauseNotActive):
        await s.claim(job_id, "rev1")
