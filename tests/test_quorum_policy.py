"""Quorum policies (SPEC §10, docs/protocol.md § Quorum) against a real redis-server: ``majority``
decides with ⌈(N+1)/2⌉ compatible submissions and reconciles once no majority can form, ``any``
lets the first submission decide (later ones on that pause: 409 PAUSE_NOT_ACTIVE), the mask review
follows the job's policy, and the policy is part of the creation (its validation, its
Idempotency-Key fingerprint, the snapshot)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_asyncio

from harness.executor import report
from harness.tokens import TOKENS, auth
from hitl_review.client import AsyncHitlClient
from hitl_review.serve_app import cli
from hitl_review.statecore import errors
from hitl_review.statecore.models import InterventionRequest
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.store import Store, StoreConfig
from hitl_review.ui.quorum import quorum_line, vote_banner

from .api_util import blank_with_product
from .asgi_util import BASE_URL, asgi_client, asgi_transport
from .helpers import THREE_BOXES, iv, keep
from .test_quorum import nudged

FAIL = {"verdict": "FAIL", "reasons": ["cut off"], "scores": {"fill": 0.9}, "policy": "gate-v1", "severity": 0.4}


async def policy_job(store: Store, image: Any, n: int, policy: str) -> str:
    job_id = (await store.create_job("alice", image, review_quorum=n, quorum_policy=policy)).job_id
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    return job_id


def outcome(body: str) -> str:
    return str(json.loads(body)["quorum"]["outcome"])


async def test_a_majority_of_three_is_decided_by_two_agreeing_reviewers(store: Store, image: Any) -> None:
    job_id = await policy_job(store, image, 3, "majority")
    st = await store.get(job_id)
    q = (await store.snapshot(job_id)).quorum
    assert q is not None and (q.needed, q.invited, q.policy) == (2, 3, "majority")
    first = await store.intervene(job_id, iv(st, keep(st, 0, 1), iid="iv_m1"), "rev1")
    assert outcome(first.body) == "VOTE_RECORDED" and (await store.get(job_id)).version == st.version
    done = await store.intervene(job_id, iv(st, nudged(st, 0, 1), iid="iv_m2"), "rev2")
    assert json.loads(done.body)["quorum"] == {
        "needed": 2,
        "received": 2,
        "reviewers": ["rev1", "rev2"],
        "outcome": "QUORUM_REACHED",
        "invited": 3,
        "policy": "majority",
    }
    after = await store.get(job_id)
    assert after.status == S.PROCESSING_APPROVED_SUBJECTS and after.version == st.version + 1
    assert [p.status for p in await store.pause_history(job_id)] == ["CONSUMED"]
    with pytest.raises(errors.VersionConflict):  # the third invited reviewer comes too late
        await store.intervene(job_id, iv(st, keep(st, 0, 1), iid="iv_m3"), "rev3")


async def test_a_split_that_leaves_no_majority_reconciles_at_once(store: Store, image: Any) -> None:
    """4 invited, 3 needed: after two different lists a third different one leaves every group at 1
    with one reviewer to come (1 + 1 < 3), so the reconciliation opens without waiting for the 4th."""
    job_id = await policy_job(store, image, 4, "majority")
    st = await store.get(job_id)
    assert outcome((await store.intervene(job_id, iv(st, keep(st, 0), iid="iv_s1"), "rev1")).body) == "VOTE_RECORDED"
    assert outcome((await store.intervene(job_id, iv(st, keep(st, 1), iid="iv_s2"), "rev2")).body) == "VOTE_RECORDED"
    out = await store.intervene(job_id, iv(st, keep(st, 2), iid="iv_s3"), "rev3")
    assert outcome(out.body) == "QUORUM_DISAGREED"
    st2 = await store.get(job_id)
    pause = st2.active_pause
    assert (
        pause is not None
        and pause.reconciliation is not None
        and sorted(pause.reconciliation)
        == [
            "rev1",
            "rev2",
            "rev3",
        ]
    )
    assert st2.version == st.version + 1 and st2.votes == ""
    disagreed = [e for e in await store.events_after(job_id) if e.type == "QUORUM_DISAGREED"]
    assert disagreed[0].data["reason"].startswith("no 3 of the 4 invited reviewers can agree")
    decided = await store.intervene(job_id, iv(st2, keep(st2, 0), iid="iv_s4"), "lead")  # one decides it
    assert decided.status_code == 200 and (await store.get(job_id)).status == S.PROCESSING_APPROVED_SUBJECTS


async def test_a_majority_still_possible_keeps_waiting(store: Store, image: Any) -> None:
    """3 invited, 2 needed: two different lists leave each group at 1 with one to come (1 + 1 = 2)."""
    job_id = await policy_job(store, image, 3, "majority")
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, 0), iid="iv_w1"), "rev1")
    assert outcome((await store.intervene(job_id, iv(st, keep(st, 1), iid="iv_w2"), "rev2")).body) == "VOTE_RECORDED"
    last = await store.intervene(job_id, iv(st, keep(st, 1), iid="iv_w3"), "rev3")  # sides with rev2
    assert json.loads(last.body)["quorum"]["reviewers"] == ["rev2", "rev3"] and outcome(last.body) == "QUORUM_REACHED"


async def test_any_lets_the_first_submission_decide(store: Store, image: Any) -> None:
    job_id = await policy_job(store, image, 3, "any")
    st = await store.get(job_id)
    q = (await store.snapshot(job_id)).quorum
    assert q is not None and (q.needed, q.invited, q.policy) == (1, 3, "any")
    first = await store.intervene(job_id, iv(st, keep(st, 0), iid="iv_a1"), "rev1")
    assert first.status_code == 200 and json.loads(first.body)["quorum"] is None
    assert (await store.get(job_id)).status == S.PROCESSING_APPROVED_SUBJECTS
    with pytest.raises(errors.PauseNotActive):  # not VERSION_CONFLICT: that pause was decided
        await store.intervene(job_id, iv(st, keep(st, 0, 1), iid="iv_a2"), "rev2")


async def test_the_mask_review_follows_the_majority(redis_server: Any, image: Any) -> None:
    s = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=60, quality_gate="review-all"))
    await s.r.flushdb()
    await s.ensure_groups()
    try:
        job_id = await policy_job(s, image, 3, "majority")
        st = await s.get(job_id)
        for who in ("rev1", "rev2"):  # the box stage: two of three agree
            await s.intervene(job_id, iv(st, keep(st, 0, 1)), who)
        st = await s.get(job_id)
        assert st.status == S.PROCESSING_APPROVED_SUBJECTS
        ids = [b.box_id for b in st.approved_box_list]
        subjects = [
            {"box_id": b, "status": "SUCCEEDED", "mask": f"m{n}.png", "cutout": f"c{n}.png", "quality": FAIL}
            for n, b in enumerate(ids)
        ]
        assert await report(s, job_id, {"subjects": subjects, "backend": "classical"}) == "OK"
        st = await s.get(job_id)
        assert st.status == S.WAITING_MASK_REVIEW and st.active_pause is not None

        def decide(iid: str, second: str) -> InterventionRequest:
            p = st.active_pause
            assert p is not None
            rows: list[dict[str, Any]] = [{"box_id": ids[0], "decision": "ACCEPT"}]
            rows.append({"box_id": ids[1], "decision": second, **({"reason": "cut in"} if second == "REJECT" else {})})
            return InterventionRequest(
                intervention_id=iid, pause_token=p.pause_token, base_version=st.version, decisions=rows
            )

        assert outcome((await s.intervene(job_id, decide("iv_k1", "ACCEPT"), "rev1")).body) == "VOTE_RECORDED"
        assert outcome((await s.intervene(job_id, decide("iv_k2", "REJECT"), "rev2")).body) == "VOTE_RECORDED"
        done = await s.intervene(job_id, decide("iv_k3", "ACCEPT"), "rev3")
        assert outcome(done.body) == "QUORUM_REACHED"
        assert json.loads(done.body)["quorum"]["reviewers"] == ["rev1", "rev3"]
        after = await s.get(job_id)
        assert after.status != S.WAITING_MASK_REVIEW and after.version == st.version + 1
        assert [r.status for r in after.results] == ["SUCCEEDED", "SUCCEEDED"]
    finally:
        await s.close()


# --------------------------------------------------------------------------- over HTTP


@pytest_asyncio.fixture
async def api(store: Store, redis_server: Any, tmp_path: Any) -> Any:
    async with asgi_client(redis_server.url, tmp_path) as c:
        yield c


def post_job(api: Any, query: str, key: str | None = None) -> Any:
    headers = {**auth("sub1"), **({"Idempotency-Key": key} if key else {})}
    files = {"image": ("q.png", blank_with_product(5), "image/png")}
    return api.post(f"/api/v1/jobs?{query}", files=files, headers=headers)


async def test_the_policy_is_part_of_the_creation(api: Any, store: Store) -> None:
    bad = await post_job(api, "review_quorum=3&quorum_policy=most")
    assert bad.status_code == 400 and bad.json()["code"] == "INVALID_REQUEST"
    made = await post_job(api, "review_quorum=3&quorum_policy=majority", key="k-policy")
    assert made.status_code == 202, made.text
    job_id = made.json()["job_id"]
    again = await post_job(api, "review_quorum=3&quorum_policy=majority", key="k-policy")
    assert again.headers.get("Idempotent-Replayed") == "true" and again.json()["job_id"] == job_id
    other = await post_job(api, "review_quorum=3&quorum_policy=any", key="k-policy")
    assert other.status_code == 409 and other.json()["code"] == "IDEMPOTENCY_CONFLICT"
    assert other.json()["snapshot"]["job_id"] == job_id
    snap = (await api.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1"))).json()
    assert snap["quorum"] == {"needed": 2, "invited": 3, "policy": "majority", "votes": []}
    listed = (await api.get("/api/v1/jobs", headers=auth("rev1"))).json()["jobs"]
    assert [(j["review_quorum"], j["quorum_policy"]) for j in listed if j["job_id"] == job_id] == [(3, "majority")]


async def test_majority_and_any_over_http(api: Any, store: Store) -> None:
    async def waiting(policy: str) -> tuple[str, dict[str, Any]]:
        r = await post_job(api, f"review_quorum=3&quorum_policy={policy}")
        job_id = r.json()["job_id"]
        assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
        return job_id, (await api.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1"))).json()

    def body(snap: dict[str, Any], iid: str) -> dict[str, Any]:
        subjects = [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"]]
        token = snap["active_pause"]["pause_token"]
        return {"intervention_id": iid, "base_version": snap["version"], "pause_token": token, "subjects": subjects}

    job_id, snap = await waiting("majority")
    url = f"/api/v1/jobs/{job_id}/interventions"
    v = await api.post(url, json=body(snap, "iv_h1"), headers=auth("rev1"))
    assert v.status_code == 200 and v.json()["quorum"]["outcome"] == "VOTE_RECORDED"
    d = await api.post(url, json=body(snap, "iv_h2"), headers=auth("rev2"))
    assert d.status_code == 200 and d.json()["quorum"]["outcome"] == "QUORUM_REACHED"

    job_id, snap = await waiting("any")
    url = f"/api/v1/jobs/{job_id}/interventions"
    first = await api.post(url, json=body(snap, "iv_h3"), headers=auth("rev1"))
    assert first.status_code == 200 and first.json()["status"] == "PROCESSING_APPROVED_SUBJECTS"
    late = await api.post(url, json=body(snap, "iv_h4"), headers=auth("rev2"))
    assert late.status_code == 409 and late.json()["code"] == "PAUSE_NOT_ACTIVE"
    assert late.json()["snapshot"]["status"] == "PROCESSING_APPROVED_SUBJECTS"


async def test_the_client_and_hitl_submit_carry_the_policy(store: Store, redis_server: Any, tmp_path: Any) -> None:
    args = cli.build_parser().parse_args(["submit", "a.png", "--quorum", "3", "--quorum-policy", "majority"])
    assert (args.quorum, args.quorum_policy) == (3, "majority")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["submit", "a.png", "--quorum-policy", "most"])
    async with asgi_transport(redis_server.url, tmp_path) as transport:
        client = AsyncHitlClient(BASE_URL, TOKENS["sub1"], transport=transport)
        try:
            made = await client.submit(blank_with_product(7), filename="a.png", review_quorum=3, quorum_policy="any")
            q = (await client.get_job(made.job_id)).quorum
            assert q is not None and (q.needed, q.invited, q.policy) == (1, 3, "any")
        finally:
            await client.aclose()


async def test_the_reviewer_page_words_the_policy(store: Store, image: Any) -> None:
    maj = await policy_job(store, image, 3, "majority")
    line = quorum_line(await store.snapshot(maj))
    assert line == "Needs **2 of 3 reviewers** (a majority) whose boxes agree — 0 of 3 submitted."
    st = await store.get(maj)
    vote = json.loads((await store.intervene(maj, iv(st, keep(st, 0), iid="iv_u1"), "rev1")).body)
    banner = vote_banner(vote) or ""
    assert banner.startswith("Your boxes are recorded — 1 of 3 reviewers") and "once 2 agree" in banner
    first = await policy_job(store, image, 3, "any")
    assert quorum_line(await store.snapshot(first)).startswith("Any of the **3 invited reviewers** decides")
