"""Round two of the pause protocol against a real redis-server: a failing manual box opens a revision
pause, and what each answer to it does (processing, rejection, partial approval, empty selection).
Refusals are checked as in ``test_state_consume_pause.py``."""

from __future__ import annotations

import json

import pytest

from hitl_review.statecore import keys
from hitl_review.statecore.errors import PauseTokenMismatch
from hitl_review.statecore.states import JobStatus as S

from .helpers import iv, manual, report, validate, waiting_job
from .revision_flow import to_revision

# --------------------------------------------------------------------------- round 2


async def test_round_one_failure_opens_round_two_pause(store, image):
    job_id, st1, good, bad = await to_revision(store, image, keep_model=True)
    st2 = await store.get(job_id)
    assert st2.status == S.WAITING_BOX_BATCH_REVISION and st2.round == 2
    p = st2.active_pause
    assert p.status == "WAITING" and p.stage == "WAITING_BOX_BATCH_REVISION" and p.round == 2
    assert p.box_ids_to_revise == [bad]
    assert p.pause_token != st1.active_pause.pause_token and p.base_version == st2.version
    assert p.snapshot_id != st1.active_pause.snapshot_id
    hist = {h.pause_token: h for h in await store.pause_history(job_id)}
    assert hist[st1.active_pause.pause_token].status == "CONSUMED"
    assert p.pause_token not in hist, "the active pause lives in meta until it is consumed"
    verdicts = {b.box_id: b.validation.status for b in st2.box_list if b.validation}
    assert verdicts == {good: "PASSED", bad: "NEEDS_REVISION"}
    assert {b.box_id for b in st2.approved_box_list} == {st1.box_list[0].box_id, good}
    assert await store.r.zscore(keys.job(job_id).waiting, job_id) is not None
    assert await store.r.zscore(keys.job(job_id).running, job_id) is None
    assert st2.snapshot().pending_actions == ["SUBMIT_BOX_LIST", "DRAW_MANUAL_BOX"]
    # The old token is dead even with the current version.
    with pytest.raises(PauseTokenMismatch):
        await store.intervene(job_id, iv(st2, [], pause_token=st1.active_pause.pause_token), "rev")


async def test_round_two_without_the_bad_box_goes_to_processing(store, image):
    job_id, st1, good, bad = await to_revision(store, image, keep_model=True)
    st2 = await store.get(job_id)
    subjects = [{"box_id": b.box_id, "bbox": list(b.bbox)} for b in st2.box_list if b.box_id != bad]
    body = json.loads((await store.intervene(job_id, iv(st2, subjects), "rev")).body)
    assert body["status"] == "PROCESSING_APPROVED_SUBJECTS" and body["diff"]["deleted"] == [bad]
    st3 = await store.get(job_id)
    assert [b.box_id for b in st3.approved_box_list] == [st1.box_list[0].box_id, good]
    assert [c.node_type for c in await store.outbox_commands(job_id)] == [
        "DETECT_SUBJECTS",
        "VALIDATE_MANUAL_BOX_LIST",
        "SEGMENT_SUBJECT",  # one node per approved subject (statecore.subjects)
        "SEGMENT_SUBJECT",
    ]
    assert all(h.status == "CONSUMED" for h in await store.pause_history(job_id))
    assert len(await store.pause_history(job_id)) == 2


async def test_round_two_revised_box_fails_again_all_rejected_fails_job(store, image):
    job_id = await waiting_job(store, image)
    st1 = await store.get(job_id)
    body = json.loads((await store.intervene(job_id, iv(st1, [manual([500, 300, 600, 400], "bad")]), "rev")).body)
    (bad,) = body["diff"]["added"]
    await validate(store, job_id, {bad: False})
    st2 = await store.get(job_id)
    assert st2.status == S.WAITING_BOX_BATCH_REVISION and st2.active_pause.box_ids_to_revise == [bad]
    # The reviewer moves the box: it is validated again, and fails again.
    body = json.loads(
        (await store.intervene(job_id, iv(st2, [{"box_id": bad, "bbox": [510, 300, 600, 400]}]), "rev")).body
    )
    assert body["next_node_type"] == "VALIDATE_MANUAL_BOX_LIST"
    cmd = (await store.outbox_commands(job_id))[-1]
    assert cmd.input["round"] == 2 and [b["box_id"] for b in cmd.input["items_to_validate"]] == [bad]
    assert await validate(store, job_id, {bad: False}) == "OK"
    st3 = await store.get(job_id)
    assert st3.status == S.FAILED and st3.reason_code == "ALL_REJECTED"
    assert st3.active_pause is None, "a job is never stuck on a second naming round"
    assert [(r.box_id, r.status) for r in st3.results] == [(bad, "REJECTED")]
    assert st3.results[0].reason == "not an object"
    assert (await store.r.hget(keys.job(job_id).meta, "round_decision")) == "ALL_REJECTED"
    assert [e.type for e in await store.events_after(job_id)][-1] == "JOB_FINISHED"


async def test_round_two_unchanged_bad_box_kept_with_model_box_is_rejected_but_job_goes_on(store, image):
    job_id, st1, good, bad = await to_revision(store, image, keep_model=True)
    st2 = await store.get(job_id)
    # Keep everything unchanged: the NEEDS_REVISION box is validated once more (round 2 decides).
    subjects = [{"box_id": b.box_id, "bbox": list(b.bbox)} for b in st2.box_list]
    await store.intervene(job_id, iv(st2, subjects), "rev")
    cmd = (await store.outbox_commands(job_id))[-1]
    assert [b["box_id"] for b in cmd.input["items_to_validate"]] == [bad]
    assert sorted(cmd.input["reusable_valid_items"]) == sorted([st1.box_list[0].box_id, good])
    await validate(store, job_id, {bad: False})
    st3 = await store.get(job_id)
    assert st3.status == S.PROCESSING_APPROVED_SUBJECTS
    assert (await store.r.hget(keys.job(job_id).meta, "round_decision")) == "ALL_REJECTED"
    assert {b.box_id: b.validation.status for b in st3.box_list if b.validation}[bad] == "REJECTED"
    assert [b.box_id for b in st3.approved_box_list] == [st1.box_list[0].box_id, good]
    # Segment what was approved; the rejected box keeps its reason in the results.
    subj = [
        {"box_id": b.box_id, "status": "SUCCEEDED", "mask": "m.png", "cutout": "c.png"} for b in st3.approved_box_list
    ]
    await report(store, job_id, {"subjects": subj})
    await report(store, job_id, {})
    end = await store.get(job_id)
    assert end.status == S.PARTIAL_SUCCEEDED
    assert {r.box_id: r.status for r in end.results} == {
        st1.box_list[0].box_id: "SUCCEEDED",
        good: "SUCCEEDED",
        bad: "REJECTED",
    }


async def test_round_two_partial_approved(store, image):
    job_id = await waiting_job(store, image)
    st1 = await store.get(job_id)
    body = json.loads(
        (
            await store.intervene(
                job_id, iv(st1, [manual([10, 300, 100, 400], "a"), manual([500, 300, 600, 400], "b")]), "rev"
            )
        ).body
    )
    a, b = body["diff"]["added"]
    await validate(store, job_id, {a: False, b: False})
    st2 = await store.get(job_id)
    assert sorted(st2.active_pause.box_ids_to_revise) == sorted([a, b])
    await store.intervene(
        job_id,
        iv(st2, [{"box_id": a, "bbox": [10, 300, 110, 400]}, {"box_id": b, "bbox": [500, 300, 610, 400]}]),
        "rev",
    )
    await validate(store, job_id, {a: True, b: False})
    st3 = await store.get(job_id)
    assert st3.status == S.PROCESSING_APPROVED_SUBJECTS
    assert (await store.r.hget(keys.job(job_id).meta, "round_decision")) == "PARTIAL_APPROVED"
    assert [x.box_id for x in st3.approved_box_list] == [a]
    assert len(await store.pause_history(job_id)) == 2


async def test_round_two_empty_list_is_empty_selection(store, image):
    job_id, *_ = await to_revision(store, image, keep_model=False)
    st2 = await store.get(job_id)
    n = len(await store.outbox_commands(job_id))
    body = json.loads((await store.intervene(job_id, iv(st2, []), "rev")).body)
    assert body["status"] == "EMPTY_SELECTION" and body["next_node_type"] is None
    assert len(await store.outbox_commands(job_id)) == n
    assert (await store.get(job_id)).status == S.EMPTY_SELECTION
