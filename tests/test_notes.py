"""Flags, skips and comments (docs/protocol.md § Flags, skips and comments) against a real
redis-server, through the ASGI app: none of them changes the job (version, pause, status); a flag
shows in the snapshot and the queue and a lead lists flagged jobs; a skip releases the claim and
hides the job from that reviewer's next-job query only; comments reach the next reviewer; each
is in the job's hash-chained audit log, and refusals are precise."""

from __future__ import annotations

import pytest

from harness.tokens import auth
from hitl_review.statecore import audit
from hitl_review.statecore.store import StoreConfig

from .asgi_util import asgi_client
from .helpers import footprint, iv, keep, waiting_job

API = "/api/v1"


@pytest.fixture
async def api(store, redis_server, tmp_path):
    async with asgi_client(redis_server.url, tmp_path, StoreConfig(retention_s=3600)) as c:
        yield c


async def get(api, job_id: str, who: str = "rev1") -> dict:
    r = await api.get(f"{API}/jobs/{job_id}", headers=auth(who))
    assert r.status_code == 200, r.text
    return r.json()


async def next_job(api, who: str) -> list[str]:
    r = await api.get(f"{API}/jobs", params={"status": "WAITING", "unclaimed": "true"}, headers=auth(who))
    assert r.status_code == 200, r.text
    return [j["job_id"] for j in r.json()["jobs"]]


def versionless(fp: dict) -> dict:
    """The job's own records: what a note must leave alone (its audit entry and event are the note's,
    with their counters in the meta)."""
    out = {k: v for k, v in fp.items() if k not in ("audit", "events")}
    out["meta"] = {k: v for k, v in fp["meta"].items() if k not in ("audit_head", "audit_seq", "event_seq")}
    return out


async def test_a_flag_changes_nothing_of_the_job_and_a_lead_finds_it(api, store, image):
    job_id = await waiting_job(store, image)
    other = await waiting_job(store, image)
    before = await footprint(store, job_id)
    r = await api.post(
        f"{API}/jobs/{job_id}/flag", json={"reason": "  odd product: a policy question  "}, headers=auth("rev1")
    )
    assert r.status_code == 200, r.text
    assert r.json()["by"] == "rev1" and r.json()["reason"] == "odd product: a policy question"
    after = await footprint(store, job_id)
    assert versionless(after) == versionless(before)  # same version, pause, status, meta
    snap = await get(api, job_id, "rev2")
    assert snap["status"] == "WAITING_USER_SELECTION" and snap["flag"]["reason"] == "odd product: a policy question"
    lead = await api.get(f"{API}/jobs", params={"status": "WAITING", "flagged": "true"}, headers=auth("admin"))
    assert [j["job_id"] for j in lead.json()["jobs"]] == [job_id]
    assert lead.json()["jobs"][0]["flag"]["by"] == "rev1"
    clean = await api.get(f"{API}/jobs", params={"status": "WAITING", "flagged": "false"}, headers=auth("admin"))
    assert [j["job_id"] for j in clean.json()["jobs"]] == [other]
    assert job_id in await next_job(api, "rev2")  # flagged jobs stay in the queue
    events = [e.type for e in await store.events_after(job_id)]
    assert events[-1] == "JOB_FLAGGED"
    r = await api.delete(f"{API}/jobs/{job_id}/flag", headers=auth("admin"))
    assert r.json() == {"removed": True}
    assert (await get(api, job_id))["flag"] is None
    assert (await api.delete(f"{API}/jobs/{job_id}/flag", headers=auth("admin"))).json() == {"removed": False}
    body = (await api.get(f"{API}/jobs/{job_id}/audit", headers=auth("rev1"))).json()
    acts = [(e["actor"], e["action"], e["outcome"]) for e in body["entries"]][-2:]
    assert acts == [("rev1", "FLAG", "FLAGGED:odd product: a policy question"), ("admin", "UNFLAG", "UNFLAGGED")]
    assert audit.verify(body["entries"], body["head"]) is None  # the chain holds


async def test_a_flagged_job_can_still_be_submitted_by_the_reviewer_who_has_it_open(api, store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await api.post(f"{API}/jobs/{job_id}/flag", json={"reason": "check the label"}, headers=auth("rev2"))
    reply = await store.intervene(job_id, iv(st, keep(st, 0)), "rev1")  # base_version still good
    assert reply.status_code == 200


async def test_skip_releases_the_claim_and_hides_the_job_from_that_reviewer_only(api, store, image):
    job_id = await waiting_job(store, image)
    assert (await api.post(f"{API}/jobs/{job_id}/claim", headers=auth("rev1"))).status_code == 200
    before = await footprint(store, job_id)
    r = await api.post(f"{API}/jobs/{job_id}/skip", headers=auth("rev1"))
    assert r.status_code == 200 and r.json()["job_id"] == job_id, r.text
    assert (await get(api, job_id))["claim"] is None
    assert versionless(await footprint(store, job_id)) == versionless(before)
    assert job_id not in await next_job(api, "rev1")
    assert job_id in await next_job(api, "rev2")
    # A short skip lapses: the job comes back to the reviewer's next-job query.
    await api.post(f"{API}/jobs/{job_id}/skip", json={"for_s": 1}, headers=auth("rev2"))
    assert job_id not in await next_job(api, "rev2")
    import asyncio

    await asyncio.sleep(1.2)
    assert job_id in await next_job(api, "rev2")
    entries = (await api.get(f"{API}/jobs/{job_id}/audit", headers=auth("rev1"))).json()["entries"]
    assert [(e["actor"], e["action"]) for e in entries if e["action"] in ("SKIP", "RELEASE")] == [
        ("rev1", "RELEASE"),
        ("rev1", "SKIP"),
        ("rev2", "SKIP"),
    ]


async def test_comments_reach_the_next_reviewer(api, store, image):
    job_id = await waiting_job(store, image)
    r = await api.post(
        f"{API}/jobs/{job_id}/comments", json={"text": "the left shoe is the product"}, headers=auth("rev1")
    )
    assert r.status_code == 201 and r.json()["by"] == "rev1", r.text
    await api.post(f"{API}/jobs/{job_id}/comments", json={"text": "张伟: 同意"}, headers=auth("rev2"))
    snap = await get(api, job_id, "admin")
    assert [(c["by"], c["text"]) for c in snap["comments"]] == [
        ("rev1", "the left shoe is the product"),
        ("rev2", "张伟: 同意"),
    ]
    body = (await api.get(f"{API}/jobs/{job_id}/audit", headers=auth("rev1"))).json()
    assert [e["outcome"] for e in body["entries"] if e["action"] == "COMMENT"] == [
        "POSTED:the left shoe is the product",
        "POSTED:张伟: 同意",
    ]
    assert audit.verify(body["entries"], body["head"]) is None


@pytest.mark.parametrize(
    "path, body, code",
    [
        ("flag", {"reason": "   "}, 400),
        ("flag", {}, 400),
        ("flag", {"reason": "x" * 501}, 400),
        ("flag", {"reason": "ok", "extra": 1}, 400),
        ("comments", {"text": ""}, 400),
        ("skip", {"for_s": 0}, 400),
    ],
)
async def test_bad_notes_are_400_and_write_nothing(api, store, image, path, body, code):
    job_id = await waiting_job(store, image)
    before = await footprint(store, job_id)
    r = await api.post(f"{API}/jobs/{job_id}/{path}", json=body, headers=auth("rev1"))
    assert (r.status_code, r.json()["code"]) == (code, "INVALID_REQUEST"), r.text
    assert await footprint(store, job_id) == before


async def test_notes_refused_where_they_make_no_sense(api, store, image):
    assert (await api.post(f"{API}/jobs/job_nope/flag", json={"reason": "x"}, headers=auth("rev1"))).status_code == 404
    job_id = await waiting_job(store, image)
    r = await api.post(f"{API}/jobs/{job_id}/flag", json={"reason": "x"}, headers=auth("sub1"))
    assert r.status_code == 403  # a submitter does not flag
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, 0)), "rev1")  # no review waits now
    r = await api.post(f"{API}/jobs/{job_id}/flag", json={"reason": "x"}, headers=auth("rev1"))
    assert (r.status_code, r.json()["code"]) == (409, "PAUSE_NOT_ACTIVE")
    r = await api.post(f"{API}/jobs/{job_id}/skip", headers=auth("rev1"))
    assert (r.status_code, r.json()["code"]) == (409, "PAUSE_NOT_ACTIVE")
    # a comment on a live job is fine; on a cancelled one, refused
    assert (
        await api.post(f"{API}/jobs/{job_id}/comments", json={"text": "hm"}, headers=auth("rev1"))
    ).status_code == 201
    await store.cancel(job_id, "admin")
    r = await api.post(f"{API}/jobs/{job_id}/comments", json={"text": "late"}, headers=auth("rev1"))
    assert (r.status_code, r.json()["code"]) == (409, "JOB_CANCELLED")


def test_the_client_flags_comments_skips_and_lists_flagged_jobs(api_server):
    """The synchronous client's calls on the real control plane under uvicorn (tests/conftest.py)."""
    from hitl_review.client import HitlClient
    from hitl_review.serve_app.ops.samples import product_composite

    from .client_integration_util import TOKENS, wait_until

    sub = HitlClient(api_server.url, token=TOKENS["sub1"])
    rev = HitlClient(api_server.url, token=TOKENS["rev1"])
    lead = HitlClient(api_server.url, token=TOKENS["admin"])
    try:
        job_id = sub.submit(product_composite(seed=31, width=160, height=120)[0]).job_id
        wait_until(lambda: rev.get_job(job_id).status == "WAITING_USER_SELECTION", 60, "the job's pause")
        flagged = rev.flag(job_id, "is the mannequin the product?")
        assert flagged.by == "rev1" and flagged.reason == "is the mannequin the product?"
        assert job_id in [j.job_id for j in lead.flagged_jobs().jobs]
        posted = rev.comment(job_id, "left one is the product")
        assert posted.text == "left one is the product"
        snap = lead.get_job(job_id)
        assert snap.flag is not None and [c.text for c in snap.comments] == ["left one is the product"]
        skipped = rev.skip(job_id, for_s=30)
        assert skipped["job_id"] == job_id and skipped["until"]
        assert lead.unflag(job_id) is True and lead.unflag(job_id) is False
        assert job_id not in [j.job_id for j in lead.flagged_jobs().jobs]
    finally:
        for c in (sub, rev, lead):
            c.close()


def test_the_cli_flags_comments_and_lists_flagged_jobs(api_server, monkeypatch, capsys):
    import json

    from hitl_review.client import HitlClient
    from hitl_review.serve_app.ops.samples import product_composite

    from .client_integration_util import TOKENS, run_cli, wait_until

    monkeypatch.setenv("HITL_API_URL", api_server.url)
    monkeypatch.setenv("HITL_TOKEN", TOKENS["rev2"])
    with HitlClient(api_server.url, token=TOKENS["sub1"]) as sub:
        job_id = sub.submit(product_composite(seed=32, width=160, height=120)[0]).job_id
        wait_until(lambda: sub.get_job(job_id).status == "WAITING_USER_SELECTION", 60, "the job's pause")
    code, out, err = run_cli(["flag", job_id, "--reason", "two products in one picture"], capsys)
    assert code == 0 and "flagged for a lead by rev2" in out, err
    code, out, err = run_cli(["comment", job_id, "ask the studio"], capsys)
    assert code == 0 and "comment by rev2" in out, err
    code, out, err = run_cli(["jobs", "--flagged", "--json"], capsys)
    assert code == 0 and job_id in [j["job_id"] for j in json.loads(out)["jobs"]], err
    code, out, err = run_cli(["status", job_id], capsys)
    assert code == 0 and "two products in one picture" in out and "ask the studio" in out, err
    code, out, err = run_cli(["flag", job_id, "--remove"], capsys)
    assert code == 0 and "flag removed" in out, err
    with pytest.raises(SystemExit) as usage:  # neither --reason nor --remove: argparse's usage error
        run_cli(["flag", job_id], capsys)
    assert usage.value.code == 2


@pytest.mark.cluster
async def test_notes_and_a_mask_review_on_a_redis_cluster(cluster_store, image):
    """notes.lua's keys and the mask review's writes stay in the job's slot on a 3-node cluster."""
    s = cluster_store
    job_id = await waiting_job(s, image)
    assert (await s.flag(job_id, "rev1", "why")).reason == "why"
    assert (await s.comment(job_id, "rev1", "a note")).text == "a note"
    await s.claim(job_id, "rev1")
    await s.skip(job_id, "rev1", 60)
    assert await s.claim_of(job_id) is None
    [(flag, skipped)] = await s.notes_of([job_id], "rev1")
    assert flag is not None and skipped
    listed, _ = await s.list_jobs(status="WAITING", unclaimed_for="rev1")
    assert job_id not in [j.job_id for j in listed]
    listed, _ = await s.list_jobs(status="WAITING", flagged=True)
    assert [j.job_id for j in listed] == [job_id]
    snap = await s.snapshot(job_id)
    assert snap.flag is not None and [c.text for c in snap.comments] == ["a note"]
    assert await s.unflag(job_id, "rev1") is True
