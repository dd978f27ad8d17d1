"""The mask review (SPEC §13, docs/protocol.md § Cut-out quality) against a real redis-server: masks
the gate still fails wait in WAITING_MASK_REVIEW behind a pause consumed exactly once, through the
same Lua script, gates and quorum as the box stages; ACCEPT / REJECT / REFINE decide each subject."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio

from harness.executor import report
from hitl_review.statecore import errors
from hitl_review.statecore.errors import IllegalTransition
from hitl_review.statecore.models import InterventionRequest
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.states import transition
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import footprint, iv, keep, waiting_job

PASS = {"verdict": "PASS", "reasons": [], "scores": {"fill": 0.62}, "policy": "gate-v1"}
FAIL = {
    "verdict": "FAIL",
    "reasons": ["the mask touches the box edge on 38% of its border"],
    "scores": {"fill": 0.91, "cut_off": 0.38},
    "policy": "gate-v1",
    "severity": 0.4,
}


async def _store(url: str, mode: str) -> Store:
    s = Store.from_url(url, StoreConfig(retention_s=3600, node_timeout_s=60, quality_gate=mode))
    await s.r.flushdb()
    await s.ensure_groups()
    return s


@pytest_asyncio.fixture
async def gated(redis_server):
    s = await _store(redis_server.url, "review-failing")
    yield s
    await s.close()


def _outcome(box_id: str, quality: dict | None, n: int) -> dict:
    out = {"box_id": box_id, "status": "SUCCEEDED", "mask": f"m{n}.png", "cutout": f"c{n}.png"}
    if quality is not None:
        out["quality"] = quality
    return out


async def _segmented(store: Store, image, qualities: list[dict | None], quorum: int = 1) -> tuple[str, list[str]]:
    """A job whose approved boxes were segmented with the given verdicts (one per box)."""
    if quorum > 1:
        job_id = (await store.create_job("alice", image, None, review_quorum=quorum)).job_id
        from .helpers import THREE_BOXES

        assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
        st = await store.get(job_id)
        for who in ("rev", "rev2")[:quorum]:
            await store.intervene(job_id, iv(st, keep(st, *range(len(qualities)))), who)
    else:
        job_id = await waiting_job(store, image)
        st = await store.get(job_id)
        await store.intervene(job_id, iv(st, keep(st, *range(len(qualities)))), "rev")
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    ids = [b.box_id for b in st.approved_box_list]
    subjects = [_outcome(b, q, n) for n, (b, q) in enumerate(zip(ids, qualities, strict=True))]
    assert await report(store, job_id, {"subjects": subjects, "backend": "classical"}) == "OK"
    return job_id, ids


def decide(state, decisions: list[dict], iid: str | None = None, **over) -> InterventionRequest:
    p = state.active_pause
    body = {
        "intervention_id": iid or f"iv_{uuid.uuid4().hex[:12]}",
        "pause_token": p.pause_token,
        "base_version": state.version,
        "decisions": decisions,
        **over,
    }
    return InterventionRequest(**body)


# --------------------------------------------------------------------------- the table


def test_the_new_edges_and_only_those() -> None:
    assert transition(S.PROCESSING_APPROVED_SUBJECTS, S.WAITING_MASK_REVIEW) == S.WAITING_MASK_REVIEW
    for target in (S.PROCESSING_APPROVED_SUBJECTS, S.FINALIZING_RESULTS, S.FAILED, S.CANCELLED):
        assert transition(S.WAITING_MASK_REVIEW, target) == target
    # A wait never times out, and a mask review never goes back to the boxes or straight to an end.
    for target in (S.TIMED_OUT, S.DETECTING, S.WAITING_USER_SELECTION, S.SUCCEEDED, S.PARTIAL_SUCCEEDED):
        with pytest.raises(IllegalTransition):
            transition(S.WAITING_MASK_REVIEW, target)
    for source in (S.DETECTING, S.WAITING_USER_SELECTION, S.VALIDATING_MANUAL_BOXES, S.FINALIZING_RESULTS):
        with pytest.raises(IllegalTransition):
            transition(source, S.WAITING_MASK_REVIEW)


# --------------------------------------------------------------------------- opening the review


async def test_a_failing_mask_waits_for_a_person_and_the_passing_one_does_not(gated, image) -> None:
    job_id, (good, bad) = await _segmented(gated, image, [PASS, FAIL])
    st = await gated.get(job_id)
    assert st.status == S.WAITING_MASK_REVIEW
    pause = st.active_pause
    assert pause is not None and pause.stage == "WAITING_MASK_REVIEW" and pause.base_version == st.version
    assert [s.box_id for s in pause.subjects_to_review or []] == [bad]
    listed = (pause.subjects_to_review or [])[0]
    assert listed.mask_url == "/api/v1/artifacts/m1.png" and listed.quality and listed.quality.verdict == "FAIL"
    by_id = {r.box_id: r for r in st.results}
    assert by_id[good].status == "SUCCEEDED" and by_id[good].decided_by == "gate"
    assert by_id[bad].status == "WAITING_REVIEW" and by_id[bad].decided_by is None
    snap = st.snapshot()
    assert snap.pending_actions == ["DECIDE_SUBJECT_MASKS"]
    assert {s.box_id: s.status for s in snap.subjects} == {good: "SUCCEEDED", bad: "WAITING_REVIEW"}
    assert snap.model_validate_json(snap.model_dump_json()).subjects == snap.subjects
    queue, _ = await gated.list_jobs(status="WAITING_MASK_REVIEW", limit=10)
    assert [j.job_id for j in queue] == [job_id]
    queue, _ = await gated.list_jobs(status="WAITING", limit=10)
    assert job_id in [j.job_id for j in queue]
    opened = [e for e in await gated.events_after(job_id) if e.type == "PAUSE_OPENED"]
    assert opened[-1].data["active_pause"]["stage"] == "WAITING_MASK_REVIEW"


async def test_every_mask_passes_no_review(gated, image) -> None:
    job_id, _ = await _segmented(gated, image, [PASS, PASS])
    assert (await gated.get(job_id)).status == S.FINALIZING_RESULTS


async def test_review_all_lists_every_mask_and_off_lists_none(redis_server, image) -> None:
    every = await _store(redis_server.url, "review-all")
    try:
        job_id, ids = await _segmented(every, image, [PASS, None])
        st = await every.get(job_id)
        assert st.status == S.WAITING_MASK_REVIEW
        assert [s.box_id for s in st.active_pause.subjects_to_review] == ids
    finally:
        await every.close()
    off = await _store(redis_server.url, "off")
    try:
        job_id, _ = await _segmented(off, image, [FAIL, FAIL])
        st = await off.get(job_id)
        assert st.status == S.FINALIZING_RESULTS and all(r.decided_by is None for r in st.results)
        assert "quality_gate" not in st.policy
    finally:
        await off.close()


# --------------------------------------------------------------------------- decisions


async def test_accept_and_reject_end_partial_succeeded_with_who_decided(gated, image) -> None:
    job_id, (a, b, c) = await _segmented(gated, image, [FAIL, FAIL, PASS])
    st = await gated.get(job_id)
    reply = await gated.intervene(
        job_id,
        decide(st, [{"box_id": a, "decision": "ACCEPT"}, {"box_id": b, "decision": "REJECT", "reason": "hand in it"}]),
        "lena",
    )
    assert reply.status_code == 200 and '"next_node_type":"FINALIZE_RESULTS"' in reply.body
    st = await gated.get(job_id)
    assert st.status == S.FINALIZING_RESULTS and st.active_pause is None
    by_id = {r.box_id: r for r in st.results}
    assert (by_id[a].status, by_id[a].decided_by) == ("SUCCEEDED", "lena")
    assert (by_id[b].status, by_id[b].decided_by, by_id[b].reason) == ("REJECTED", "lena", "hand in it")
    assert by_id[b].mask_url is None and by_id[b].cutout_url is None  # a rejected mask never ships
    assert by_id[c].decided_by == "gate"
    decided = [e.data for e in await gated.events_after(job_id) if e.type == "SUBJECT_DECIDED"]
    assert [(d["box_id"], d["decision"], d["decided_by"]) for d in decided] == [
        (a, "ACCEPT", "lena"),
        (b, "REJECT", "lena"),
    ]
    assert await report(gated, job_id, {}) == "OK"
    done = await gated.get(job_id)
    assert done.status == S.PARTIAL_SUCCEEDED and done.reason_code == "SOME_SUBJECTS_FAILED"


async def test_accept_only_succeeds(gated, image) -> None:
    job_id, (a,) = await _segmented(gated, image, [FAIL])
    st = await gated.get(job_id)
    await gated.intervene(job_id, decide(st, [{"box_id": a, "decision": "ACCEPT"}]), "lena")
    assert await report(gated, job_id, {}) == "OK"
    assert (await gated.get(job_id)).status == S.SUCCEEDED


async def test_reject_everything_fails(gated, image) -> None:
    job_id, (a,) = await _segmented(gated, image, [FAIL])
    st = await gated.get(job_id)
    await gated.intervene(job_id, decide(st, [{"box_id": a, "decision": "REJECT", "reason": "shadow"}]), "lena")
    assert await report(gated, job_id, {}) == "OK"
    done = await gated.get(job_id)
    assert done.status == S.FAILED and done.reason_code == "ALL_SUBJECTS_FAILED"


async def test_refine_runs_the_reviewers_points_and_the_result_is_final(gated, image) -> None:
    job_id, (a, b) = await _segmented(gated, image, [FAIL, FAIL])
    st = await gated.get(job_id)
    points = [{"x": 50.0, "y": 60.0, "positive": True}, {"x": 12.0, "y": 12.0, "positive": False}]
    await gated.intervene(
        job_id,
        decide(st, [{"box_id": a, "decision": "REFINE", "points": points}, {"box_id": b, "decision": "ACCEPT"}]),
        "lena",
    )
    st = await gated.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    (node,) = st.subject_nodes.values()  # the refined subject's node alone
    assert node.node_type == "SEGMENT_SUBJECT" and node.box_id == a
    (cmd,) = [c for c in await gated.outbox_commands(job_id) if c.node_instance_id == node.node_instance_id]
    assert [x["box_id"] for x in cmd.input["approved_box_list"]] == [a]
    assert cmd.input["prompts"] == {a: points}
    assert {r.box_id: r.status for r in st.results} == {a: "REFINING", b: "SUCCEEDED"}
    # The refined mask fails the gate again: it is final all the same (the reviewer decided).
    assert await report(gated, job_id, {"subjects": [_outcome(a, FAIL, 9)], "backend": "classical"}) == "OK"
    st = await gated.get(job_id)
    assert st.status == S.FINALIZING_RESULTS
    by_id = {r.box_id: r for r in st.results}
    assert (by_id[a].status, by_id[a].decided_by, by_id[a].mask_url) == (
        "SUCCEEDED",
        "lena",
        "/api/v1/artifacts/m9.png",
    )
    assert await report(gated, job_id, {}) == "OK"
    assert (await gated.get(job_id)).status == S.SUCCEEDED


async def test_a_refine_the_segmenter_cannot_answer_fails_that_subject_alone(gated, image) -> None:
    job_id, (a, b) = await _segmented(gated, image, [FAIL, FAIL])
    st = await gated.get(job_id)
    pts = [{"x": 5, "y": 5, "positive": True}]
    await gated.intervene(
        job_id,
        decide(st, [{"box_id": a, "decision": "REFINE", "points": pts}, {"box_id": b, "decision": "ACCEPT"}]),
        "lena",
    )
    failed = {"box_id": a, "status": "FAILED", "reason": "the mask from the reviewer's points came out empty"}
    assert await report(gated, job_id, {"subjects": [failed]}) == "OK"
    assert await report(gated, job_id, {}) == "OK"
    done = await gated.get(job_id)
    assert done.status == S.PARTIAL_SUCCEEDED
    assert {r.box_id: r.status for r in done.results} == {a: "FAILED", b: "SUCCEEDED"}


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "bad, why",
    [
        (lambda a, b: [{"box_id": a, "decision": "ACCEPT"}], "no decision for subject"),
        (lambda a, b: [{"box_id": a, "decision": "ACCEPT"}, {"box_id": a, "decision": "ACCEPT"}], "second time"),
        (
            lambda a, b: [{"box_id": a, "decision": "ACCEPT"}, {"box_id": "box_nope", "decision": "ACCEPT"}],
            "not a subject",
        ),
        (lambda a, b: [{"box_id": a, "decision": "ACCEPT"}, {"box_id": b, "decision": "REJECT"}], "needs a reason"),
        (
            lambda a, b: [{"box_id": a, "decision": "ACCEPT"}, {"box_id": b, "decision": "REJECT", "reason": "  "}],
            "needs a reason",
        ),
        (lambda a, b: [{"box_id": a, "decision": "ACCEPT"}, {"box_id": b, "decision": "REFINE"}], "at least one point"),
        (
            lambda a, b: [
                {"box_id": a, "decision": "ACCEPT"},
                {"box_id": b, "decision": "REFINE", "points": [{"x": 640, "y": 10, "positive": True}]},
            ],
            "outside",
        ),
    ],
)
async def test_bad_decisions_are_400_and_write_nothing(gated, image, bad, why) -> None:
    job_id, (a, b) = await _segmented(gated, image, [FAIL, FAIL])
    st = await gated.get(job_id)
    before = await footprint(gated, job_id)
    with pytest.raises(errors.InvalidRequest, match=why):
        await gated.intervene(job_id, decide(st, bad(a, b)), "lena")
    after = await footprint(gated, job_id)
    after.pop("audit", None), before.pop("audit", None)  # the refusal is audited, nothing else
    assert after == before


async def test_the_wrong_kind_of_submission_is_400_either_way(gated, image) -> None:
    job_id, (a,) = await _segmented(gated, image, [FAIL])
    st = await gated.get(job_id)
    with pytest.raises(errors.InvalidRequest, match="mask review"):
        await gated.intervene(job_id, iv(st, [{"box_id": a, "bbox": [10, 10, 100, 120]}]), "lena")
    box_job = await waiting_job(gated, image)
    bst = await gated.get(box_job)
    with pytest.raises(errors.InvalidRequest, match="box stage"):
        await gated.intervene(box_job, decide(bst, [{"box_id": "x", "decision": "ACCEPT"}]), "lena")
    with pytest.raises(ValueError, match="not both"):
        decide(bst, [], subjects=[])


async def test_409s_replay_and_idempotency_conflict(gated, image) -> None:
    job_id, (a,) = await _segmented(gated, image, [FAIL])
    st = await gated.get(job_id)
    with pytest.raises(errors.VersionConflict) as stale:
        await gated.intervene(
            job_id, decide(st, [{"box_id": a, "decision": "ACCEPT"}], base_version=st.version - 1), "x"
        )
    assert stale.value.details["rebase"] is not None
    with pytest.raises(errors.PauseTokenMismatch):
        await gated.intervene(job_id, decide(st, [{"box_id": a, "decision": "ACCEPT"}], pause_token="pause_x"), "x")
    # A 409 wins over a 400: a stale tab with bad decisions is told to redraw first.
    with pytest.raises(errors.VersionConflict):
        await gated.intervene(job_id, decide(st, [], base_version=st.version - 1), "x")
    req = decide(st, [{"box_id": a, "decision": "ACCEPT"}], iid="iv_mask_once")
    first = await gated.intervene(job_id, req, "lena")
    again = await gated.intervene(job_id, req, "lena")  # a double-click
    assert (first.replayed, again.replayed, again.body) == (False, True, first.body)
    other = decide(st, [{"box_id": a, "decision": "REJECT", "reason": "no"}], iid="iv_mask_once")
    with pytest.raises(errors.IdempotencyConflict):
        await gated.intervene(job_id, other, "lena")
    with pytest.raises(errors.PauseNotActive):  # a second tab, its own id, the pause already consumed
        await gated.intervene(
            job_id, decide(st, [{"box_id": a, "decision": "ACCEPT"}], base_version=st.version + 1), "x"
        )
    consumed = [e for e in await gated.events_after(job_id) if e.type == "INTERVENTION_ACCEPTED"]
    assert len(consumed) == 2  # the box round and the mask review, each once


async def test_cancel_during_mask_review_and_a_late_refine_report(gated, image) -> None:
    job_id, (a, b) = await _segmented(gated, image, [FAIL, FAIL])
    st = await gated.get(job_id)
    snap = await gated.cancel(job_id, "lead")
    assert snap.status == S.CANCELLED and snap.active_pause is None
    both = [{"box_id": a, "decision": "ACCEPT"}, {"box_id": b, "decision": "ACCEPT"}]
    with pytest.raises(errors.JobCancelled):
        await gated.intervene(job_id, decide(st, both), "x")
    history = await gated.pause_history(job_id)
    assert [p.status for p in history if p.stage == "WAITING_MASK_REVIEW"] == ["CANCELLED"]
    # A refine's report arriving after a cancel changes nothing.
    job2, (c,) = await _segmented(gated, image, [FAIL])
    st2 = await gated.get(job2)
    await gated.intervene(job2, decide(st2, [{"box_id": c, "decision": "REFINE", "points": [{"x": 1, "y": 1}]}]), "x")
    (node,) = (await gated.get(job2)).subject_nodes.values()
    await gated.cancel(job2, "lead")
    before = await gated.get(job2)
    from hitl_review.statecore.models import NodeReport

    verdict = await gated.apply_report(
        NodeReport(
            node_instance_id=node.node_instance_id,
            node_type=node.node_type,
            job_id=job2,
            outcome="SUCCEEDED",
            output={"subjects": [_outcome(c, PASS, 7)]},
        )
    )
    assert verdict == "IGNORED"
    after = await gated.get(job2)
    assert (after.status, after.version, after.results) == (S.CANCELLED, before.version, before.results)


async def test_quorum_of_two_on_a_mask_review(gated, image) -> None:
    job_id, (a, b) = await _segmented(gated, image, [FAIL, FAIL], quorum=2)
    st = await gated.get(job_id)
    assert st.status == S.WAITING_MASK_REVIEW
    agree = [{"box_id": a, "decision": "ACCEPT"}, {"box_id": b, "decision": "REJECT", "reason": "hand"}]
    vote = await gated.intervene(job_id, decide(st, agree), "rev")
    assert '"outcome":"VOTE_RECORDED"' in vote.body and (await gated.get(job_id)).version == st.version
    other = [{"box_id": a, "decision": "ACCEPT"}, {"box_id": b, "decision": "ACCEPT"}]
    await gated.intervene(job_id, decide(st, other), "rev2")
    st2 = await gated.get(job_id)  # they disagree on b: a reconciliation of the same review
    assert st2.status == S.WAITING_MASK_REVIEW and st2.active_pause.reconciliation is not None
    assert st2.active_pause.stage == "WAITING_MASK_REVIEW"
    assert [s.box_id for s in st2.active_pause.subjects_to_review] == [a, b]
    assert set(st2.active_pause.reconciliation) == {"rev", "rev2"}
    await gated.intervene(job_id, decide(st2, agree), "lead")  # one reviewer decides the reconciliation
    st3 = await gated.get(job_id)
    assert st3.status == S.FINALIZING_RESULTS
    assert {r.box_id: r.status for r in st3.results}[b] == "REJECTED"


@pytest.mark.cluster
async def test_a_mask_review_on_a_redis_cluster(redis_cluster, image) -> None:
    s = Store.from_url(
        redis_cluster.url, StoreConfig(retention_s=3600, node_timeout_s=60, quality_gate="review-failing"), cluster=True
    )
    await s.r.flushall()
    await s.ensure_groups()
    try:
        job_id, (a, b) = await _segmented(s, image, [FAIL, PASS])
        st = await s.get(job_id)
        assert st.status == S.WAITING_MASK_REVIEW
        pts = [{"x": 20, "y": 20, "positive": True}]
        await s.intervene(job_id, decide(st, [{"box_id": a, "decision": "REFINE", "points": pts}]), "lena")
        assert await report(s, job_id, {"subjects": [_outcome(a, None, 3)]}) == "OK"
        assert await report(s, job_id, {}) == "OK"
        assert (await s.get(job_id)).status == S.SUCCEEDED
    finally:
        await s.close()
