"""Review quorum (docs/protocol.md § Quorum) against a real Redis: N distinct reviewers' agreeing lists
consume the pause once; a vote never moves the version; a disagreement opens a reconciliation pause
with the lists side by side (the old token refused); racing reviewers decide exactly once."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from harness.tokens import auth
from hitl_review.statecore import errors, quorum
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.store import Store

from .api_util import blank_with_product, wait_status
from .helpers import THREE_BOXES, audit_tail, iv, keep, report


async def quorum_job(store: Store, image: Any, n: int) -> str:
    job_id = (await store.create_job("alice", image, review_quorum=n)).job_id
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    return job_id


def nudged(state: Any, *idx: int, dx: float = 2.0) -> list[dict[str, Any]]:
    """The boxes ``idx`` kept, moved by ``dx`` pixels (IoU well above 0.9 for these sizes)."""
    out = []
    for i in idx:
        b = state.box_list[i]
        out.append({"box_id": b.box_id, "bbox": [b.bbox[0] + dx, b.bbox[1], b.bbox[2] + dx, b.bbox[3]]})
    return out


async def test_agreeing_reviewers_consume_the_pause_once(store: Store, image: Any) -> None:
    job_id = await quorum_job(store, image, 2)
    st = await store.get(job_id)
    first = await store.intervene(job_id, iv(st, keep(st, 2), iid="iv_a1"), "rev1")
    body = first.body
    assert '"outcome":"VOTE_RECORDED"' in body and '"needed":2' in body
    after = await store.get(job_id)
    assert after.version == st.version and after.active_pause == st.active_pause  # a vote is not a change
    # rev1 changes their mind: the vote is replaced, still one reviewer
    await store.intervene(job_id, iv(st, keep(st, 0, 1), iid="iv_a2"), "rev1")
    snap = await store.snapshot(job_id)
    assert snap.quorum is not None and snap.quorum.needed == 2 and [v.reviewer for v in snap.quorum.votes] == ["rev1"]
    assert (await store.intervene(job_id, iv(st, keep(st, 0, 1), iid="iv_a2"), "rev1")).replayed
    done = await store.intervene(job_id, iv(st, nudged(st, 0, 1), iid="iv_b"), "rev2")
    assert '"outcome":"QUORUM_REACHED"' in done.body
    final = await store.get(job_id)
    assert final.version == st.version + 1 and final.status == S.PROCESSING_APPROVED_SUBJECTS
    assert final.votes == "" and [b.bbox[0] for b in final.box_list] == [b["bbox"][0] for b in nudged(st, 0, 1)]
    consumed = (await store.pause_history(job_id))[0]
    assert (
        consumed.status == "CONSUMED" and consumed.consumed_by is not None and consumed.consumed_by.reviewer == "rev2"
    )
    types = [e.type for e in await store.events_after(job_id)]
    assert types.count("QUORUM_VOTE") == 2 and types.count("QUORUM_REACHED") == 1
    assert types.count("INTERVENTION_ACCEPTED") == 1
    assert await audit_tail(store, job_id, 4) == [
        ("rev1", "QUORUM_VOTE", "ACCEPTED"),
        ("rev1", "QUORUM_VOTE", "ACCEPTED"),
        ("rev1", "INTERVENE", "REPLAYED"),
        ("rev2", "INTERVENE", "ACCEPTED"),
    ]


async def test_the_next_job_for_a_reviewer_leaves_out_the_quorum_jobs_they_voted_on(store: Store, image: Any) -> None:
    """N asks for the next job with ``unclaimed_for``: a quorum job this reviewer voted on waits for the
    others, so it is not offered to them again (a second vote would only replace their first)."""
    job_id = await quorum_job(store, image, 2)
    st = await store.get(job_id)

    async def next_for(reviewer: str) -> list[str]:
        jobs, _ = await store.list_jobs(status="WAITING", limit=50, unclaimed_for=reviewer)
        return [j.job_id for j in jobs]

    assert job_id in await next_for("rev1") and job_id in await next_for("rev2")
    await store.intervene(job_id, iv(st, keep(st, 2), iid="iv_n1"), "rev1")
    assert job_id not in await next_for("rev1")
    assert job_id in await next_for("rev2")
    everyone, _ = await store.list_jobs(status="WAITING", limit=50)  # the queue itself still lists it
    assert job_id in [j.job_id for j in everyone]


async def test_disagreeing_reviewers_open_a_reconciliation_pause(store: Store, image: Any) -> None:
    job_id = await quorum_job(store, image, 2)
    st = await store.get(job_id)
    old = st.active_pause
    assert old is not None
    await store.intervene(job_id, iv(st, keep(st, 0, 1), iid="iv_1"), "rev1")
    out = await store.intervene(job_id, iv(st, keep(st, 0), iid="iv_2"), "rev2")
    assert '"outcome":"QUORUM_DISAGREED"' in out.body
    st2 = await store.get(job_id)
    new = st2.active_pause
    assert new is not None and new.pause_token != old.pause_token and st2.status == S.WAITING_USER_SELECTION
    assert st2.version == st.version + 1 and new.reconciliation is not None
    assert sorted(new.reconciliation) == ["rev1", "rev2"]
    assert [s["box_id"] for s in new.reconciliation["rev1"]] == [b.box_id for b in st.box_list[:2]]
    assert quorum.quorum_of(st2) == 1 and (await store.snapshot(job_id)).quorum.needed == 1  # type: ignore[union-attr]  # a quorum job
    with pytest.raises(errors.PauseTokenMismatch):  # the superseded pause's token is refused
        await store.intervene(
            job_id, iv(st, keep(st, 0), iid="iv_3").model_copy(update={"base_version": st2.version}), "rev1"
        )
    # one reviewer decides the reconciliation
    decided = await store.intervene(job_id, iv(st2, keep(st2, 0), iid="iv_4"), "lead")
    assert decided.status_code == 200
    assert (await store.get(job_id)).status == S.PROCESSING_APPROVED_SUBJECTS
    types = [e.type for e in await store.events_after(job_id)]
    assert "QUORUM_DISAGREED" in types and types.count("PAUSE_OPENED") == 2


async def test_racing_reviewers_decide_exactly_once(store: Store, image: Any) -> None:
    job_id = await quorum_job(store, image, 3)
    st = await store.get(job_id)
    outcomes: list[str] = []

    async def one(i: int) -> None:
        try:
            r = await store.intervene(job_id, iv(st, keep(st, 0, 1), iid=f"iv_r{i}"), f"rev{i}")
            body = r.body
            outcomes.append(body.split('"outcome":"')[1].split('"')[0])
        except errors.Conflict as e:
            outcomes.append(e.code)

    await asyncio.gather(*(one(i) for i in range(8)))
    assert outcomes.count("QUORUM_REACHED") == 1 and outcomes.count("VOTE_RECORDED") == 2, outcomes
    assert all(o in ("VOTE_RECORDED", "QUORUM_REACHED", "VERSION_CONFLICT", "PAUSE_NOT_ACTIVE") for o in outcomes)
    assert (await store.get(job_id)).version == st.version + 1
    assert [p.status for p in await store.pause_history(job_id)] == ["CONSUMED"]


def test_quorum_over_http(api_server: Any) -> None:
    with httpx.Client(base_url=api_server.url, timeout=30) as c:
        files = {"image": ("q.png", blank_with_product(21), "image/png")}
        assert c.post("/api/v1/jobs?review_quorum=11", files=files, headers=auth("sub1")).status_code == 400
        r = c.post("/api/v1/jobs?review_quorum=2", files=files, headers=auth("sub1"))
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        snap = wait_status(c, job_id, {"WAITING_USER_SELECTION"})
        assert snap["quorum"] == {"needed": 2, "invited": 2, "policy": "all", "votes": []}
        body = {
            "intervention_id": "iv_http_1",
            "base_version": snap["version"],
            "pause_token": snap["active_pause"]["pause_token"],
            "subjects": [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"]],
        }
        v = c.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=auth("rev1"))
        assert v.status_code == 200 and v.json()["quorum"]["outcome"] == "VOTE_RECORDED"
        assert c.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1")).json()["quorum"]["votes"][0]["reviewer"] == "rev1"
        d = c.post(
            f"/api/v1/jobs/{job_id}/interventions", json={**body, "intervention_id": "iv_http_2"}, headers=auth("rev2")
        )
        assert d.status_code == 200 and d.json()["quorum"]["outcome"] == "QUORUM_REACHED"
        assert wait_status(c, job_id)["status"] == "SUCCEEDED"


@pytest.mark.cluster
async def test_a_quorum_and_its_audit_on_a_redis_cluster(cluster_store: Store, image: Any) -> None:
    """The vote, the decision and the audit chain touch only the job's hash slot: on a 3-master Redis
    Cluster as on one server."""
    from hitl_review.statecore import audit

    job_id = await quorum_job(cluster_store, image, 2)
    st = await cluster_store.get(job_id)
    assert '"VOTE_RECORDED"' in (await cluster_store.intervene(job_id, iv(st, keep(st, 0), iid="iv_c1"), "rev1")).body
    done = await cluster_store.intervene(job_id, iv(st, nudged(st, 0), iid="iv_c2"), "rev2")
    assert '"QUORUM_REACHED"' in done.body
    log = await cluster_store.audit(job_id)
    assert log is not None and audit.verify(log["entries"], log["head"], log["head_seq"]) is None
    assert [(e["action"], e["outcome"]) for e in log["entries"]][-2:] == [
        ("QUORUM_VOTE", "ACCEPTED"),
        ("INTERVENE", "ACCEPTED"),
    ]
