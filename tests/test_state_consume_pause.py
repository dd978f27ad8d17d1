"""consume_pause and cancel against a real redis-server.

Every refusal is checked for what it did NOT write as much as for its code:
the job's meta, pause history, events, idempotency records, reports and its
outbox stream are compared byte for byte before and after.

Round two is in ``test_state_round_two.py``; reports, events and retention in
``test_state_reports_events_retention.py``.
"""

from __future__ import annotations

import json

import pytest

from hitl_review.statecore import keys
from hitl_review.statecore.errors import (
    IdempotencyConflict,
    InvalidRequest,
    JobCancelled,
    JobTerminal,
    PauseNotActive,
    PauseTokenMismatch,
    VersionConflict,
)
from hitl_review.statecore.models import InterventionRequest, NodeReport
from hitl_review.statecore.states import JobStatus as S

from .helpers import THREE_BOXES, audit_tail, create, footprint, iv, keep, manual, report, waiting_job


def _assert_snapshot(err, state):
    assert isinstance(err.snapshot, dict)
    assert err.snapshot["job_id"] == state.job_id
    assert err.snapshot["version"] == state.version
    assert err.snapshot["status"] == state.status.value
    body = err.to_body()
    assert body["code"] == err.code and body["snapshot"] == err.snapshot
    assert err.status == 409


# --------------------------------------------------------------------------- 400s


@pytest.mark.parametrize(
    "case",
    ["unknown_box_id", "duplicate_box_id", "duplicate_via_candidate", "bbox_outside_width", "bbox_outside_height"],
)
async def test_400_touches_nothing(store, image, case):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    b0 = st.box_list[0]
    subjects = {
        "unknown_box_id": keep(st, 0) + [{"box_id": "box_does_not_exist", "bbox": [1, 1, 5, 5]}],
        "duplicate_box_id": keep(st, 0, 1) + [{"box_id": b0.box_id, "bbox": [1, 1, 5, 5]}],
        "duplicate_via_candidate": keep(st, 0) + [{"candidate_id": b0.box_id, "bbox": [1, 1, 5, 5]}],
        "bbox_outside_width": keep(st, 0) + [manual([600, 10, image.width + 1, 50])],
        "bbox_outside_height": keep(st, 0) + [manual([10, 10, 50, image.height + 0.5])],
    }[case]
    before = await footprint(store, job_id)
    req = iv(st, subjects, iid="iv_bad")
    with pytest.raises(InvalidRequest) as ei:
        await store.intervene(job_id, req, "rev")
    assert ei.value.status == 400 and ei.value.code == "INVALID_REQUEST"
    assert await footprint(store, job_id) == before
    assert await audit_tail(store, job_id) == [("rev", "INTERVENE", "REFUSED:INVALID_REQUEST")]  # only the audit
    # Nothing was recorded under that intervention id: it can still be used for a valid body.
    ok = await store.intervene(job_id, iv(st, keep(st, 0), iid="iv_bad"), "rev")
    assert ok.status_code == 200 and not ok.replayed
    assert (await store.get(job_id)).version == st.version + 1


def test_degenerate_or_malformed_bodies_are_rejected_by_the_request_model():
    base = {"intervention_id": "iv_1", "pause_token": "pause_x", "base_version": 2}
    for subjects in (
        [{"bbox": [10, 10, 10, 20]}],
        [{"bbox": [10, 20, 30, 5]}],
        [{"bbox": [-1, 0, 5, 5]}],
        [{"bbox": [0, 0, float("nan"), 5]}],
        [{"bbox": [0, 0, 5]}],
        [{"bbox": ["0", 0, 5, 5]}],
    ):
        with pytest.raises(ValueError):
            InterventionRequest(**base, subjects=subjects)
    for bad in (
        {"base_version": True},
        {"base_version": "2"},
        {"intervention_id": ""},
        {"intervention_id": "iv with space"},
        {"pause_token": ""},
    ):
        with pytest.raises(ValueError):
            InterventionRequest(**{**base, "subjects": [], **bad})
    with pytest.raises(ValueError):
        InterventionRequest(**{k: v for k, v in base.items() if k != "pause_token"}, subjects=[])


async def test_409_checks_win_over_unknown_box_but_image_bounds_win_over_409(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    unknown = [{"box_id": "box_nope", "bbox": [1, 1, 5, 5]}]
    with pytest.raises(VersionConflict):
        await store.intervene(job_id, iv(st, unknown, base_version=st.version - 1), "rev")
    with pytest.raises(PauseTokenMismatch):
        await store.intervene(job_id, iv(st, unknown, pause_token="pause_other"), "rev")
    outside = [manual([0, 0, image.width + 10, 10])]
    with pytest.raises(InvalidRequest):
        await store.intervene(job_id, iv(st, outside, base_version=st.version - 1), "rev")


# --------------------------------------------------------------------------- 409s


async def test_409_idempotency_conflict_other_payload(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, 0, 1), iid="iv_a"), "rev")
    after = await store.get(job_id)
    before = await footprint(store, job_id)
    with pytest.raises(IdempotencyConflict) as ei:
        await store.intervene(job_id, iv(st, keep(st, 0), iid="iv_a"), "rev")
    _assert_snapshot(ei.value, after)
    assert ei.value.snapshot["status"] == "PROCESSING_APPROVED_SUBJECTS"
    assert await footprint(store, job_id) == before


async def test_409_idempotency_conflict_same_payload_other_reviewer(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    req = iv(st, keep(st, 0, 1), iid="iv_a")
    await store.intervene(job_id, req, "alice")
    before = await footprint(store, job_id)
    with pytest.raises(IdempotencyConflict) as ei:
        await store.intervene(job_id, req, "bob")
    _assert_snapshot(ei.value, await store.get(job_id))
    assert await footprint(store, job_id) == before


async def test_409_job_cancelled(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.cancel(job_id, "admin")
    cancelled = await store.get(job_id)
    before = await footprint(store, job_id)
    # Cancel is checked before the version: a stale view still learns the job is cancelled.
    for req in (iv(st, keep(st, 0)), iv(st, keep(st, 0), base_version=cancelled.version)):
        with pytest.raises(JobCancelled) as ei:
            await store.intervene(job_id, req, "rev")
        _assert_snapshot(ei.value, cancelled)
        assert ei.value.snapshot["status"] == "CANCELLED" and ei.value.snapshot["active_pause"] is None
    assert await footprint(store, job_id) == before


@pytest.mark.parametrize("delta", [-1, 1, 100])
async def test_409_version_conflict(store, image, delta):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    before = await footprint(store, job_id)
    with pytest.raises(VersionConflict) as ei:
        await store.intervene(job_id, iv(st, keep(st, 0), base_version=st.version + delta), "rev")
    _assert_snapshot(ei.value, st)
    assert ei.value.snapshot["active_pause"]["pause_token"] == st.active_pause.pause_token
    assert await footprint(store, job_id) == before


async def test_409_pause_not_active_while_detecting_and_after_consume(store, image):
    job_id = await create(store, image)
    st = await store.get(job_id)
    assert st.status == S.DETECTING and st.active_pause is None
    before = await footprint(store, job_id)
    with pytest.raises(PauseNotActive) as ei:
        await store.intervene(job_id, iv(st, []), "rev")
    _assert_snapshot(ei.value, st)
    assert await footprint(store, job_id) == before

    await report(store, job_id, {"boxes": THREE_BOXES})
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, 0)), "rev")
    now = await store.get(job_id)
    # The current version but the old (consumed) token: no pause is waiting any more.
    with pytest.raises(PauseNotActive) as ei:
        await store.intervene(job_id, iv(st, keep(st, 0), base_version=now.version), "rev")
    _assert_snapshot(ei.value, now)


async def test_409_pause_token_mismatch(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    before = await footprint(store, job_id)
    with pytest.raises(PauseTokenMismatch) as ei:
        await store.intervene(job_id, iv(st, keep(st, 0), pause_token="pause_0000000000"), "rev")
    _assert_snapshot(ei.value, st)
    assert await footprint(store, job_id) == before


# --------------------------------------------------------------------------- replay


async def test_replay_is_byte_identical_and_writes_nothing(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    req = iv(st, keep(st, 0) + [manual([300, 300, 400, 400], "mug")], iid="iv_replay")
    first = await store.intervene(job_id, req, "rev")
    assert first.status_code == 200 and not first.replayed
    body = json.loads(first.body)
    assert body["accepted"] is True and body["version"] == st.version + 1
    assert body["status"] == "VALIDATING_MANUAL_BOXES"
    before = await footprint(store, job_id)
    for _ in range(3):
        again = await store.intervene(job_id, req, "rev")
        assert again.replayed is True and again.status_code == 200
        assert again.body == first.body  # the manual box's generated id included
        assert await footprint(store, job_id) == before


async def test_replay_wins_over_later_state_and_cancel(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    req = iv(st, keep(st, 0, 2), iid="iv_late")
    first = await store.intervene(job_id, req, "rev")
    await store.cancel(job_id, "admin")
    again = await store.intervene(job_id, req, "rev")
    assert again.replayed and again.body == first.body
    with pytest.raises(JobCancelled):
        await store.intervene(job_id, iv(st, keep(st, 0, 2), iid="iv_other"), "rev")


# --------------------------------------------------------------------------- next hops


async def test_empty_subjects_is_empty_selection_without_model_work(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    cmds_before = await store.outbox_commands(job_id)
    reply = await store.intervene(job_id, iv(st, []), "rev")
    body = json.loads(reply.body)
    assert body["status"] == "EMPTY_SELECTION" and body["next_node_type"] is None
    assert sorted(body["diff"]["deleted"]) == sorted(b.box_id for b in st.box_list)
    assert await store.outbox_commands(job_id) == cmds_before
    assert [c.node_type for c in cmds_before] == ["DETECT_SUBJECTS"]
    after = await store.get(job_id)
    assert after.status == S.EMPTY_SELECTION and after.empty_selection and after.reason_code is None
    assert after.active_pause is None and after.approved_box_list == [] and after.box_list == []
    types = [e.type for e in await store.events_after(job_id)]
    assert types[-4:] == ["INTERVENTION_ACCEPTED", "STATUS_CHANGED", "EMPTY_SELECTION_SUBMITTED", "JOB_FINISHED"]
    assert types.count("JOB_FINISHED") == 1
    assert await store.r.zscore(keys.job(job_id).waiting, job_id) is None
    assert await store.r.zscore(keys.job(job_id).running, job_id) is None


async def test_manual_box_goes_to_validation(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    reply = await store.intervene(job_id, iv(st, keep(st, 1) + [manual([300, 300, 400, 400], "mug")]), "rev")
    body = json.loads(reply.body)
    assert body["status"] == "VALIDATING_MANUAL_BOXES" and body["next_node_type"] == "VALIDATE_MANUAL_BOX_LIST"
    assert body["diff"]["kept"] == [st.box_list[1].box_id]
    assert len(body["diff"]["added"]) == 1
    assert sorted(body["diff"]["deleted"]) == sorted([st.box_list[0].box_id, st.box_list[2].box_id])
    after = await store.get(job_id)
    new_id = body["diff"]["added"][0]
    assert [b.box_id for b in after.box_list] == [st.box_list[1].box_id, new_id]
    assert after.box_list[1].source == "manual" and after.box_list[1].label == "mug"
    assert [b.box_id for b in after.approved_box_list] == [st.box_list[1].box_id]
    cmds = await store.outbox_commands(job_id)
    assert [c.node_type for c in cmds] == ["DETECT_SUBJECTS", "VALIDATE_MANUAL_BOX_LIST"]
    assert cmds[-1].node_instance_id == after.current_node.node_instance_id
    assert [b["box_id"] for b in cmds[-1].input["items_to_validate"]] == [new_id]
    assert cmds[-1].input["reusable_valid_items"] == [st.box_list[1].box_id]
    hist = await store.pause_history(job_id)
    assert len(hist) == 1 and hist[0].status == "CONSUMED"
    assert hist[0].consumed_by.intervention_id == body["intervention_id"] and hist[0].consumed_by.reviewer == "rev"
    assert await store.r.zscore(keys.job(job_id).waiting, job_id) is None
    # The validation node is queued (no deadline until a dispatcher starts it).
    assert await store.r.zscore(keys.job(job_id).queued, job_id) is not None
    assert await store.r.zscore(keys.job(job_id).running, job_id) is None


async def test_model_boxes_only_go_to_processing(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    moved = [{"box_id": st.box_list[2].box_id, "bbox": [1, 2, 30, 40], "label": "glove"}]
    reply = await store.intervene(job_id, iv(st, moved), "rev")
    body = json.loads(reply.body)
    assert body["status"] == "PROCESSING_APPROVED_SUBJECTS"
    assert body["next_node_type"] == "PROCESS_APPROVED_BOX_LIST" and body["diff"]["added"] == []
    after = await store.get(job_id)
    assert [(b.box_id, b.bbox, b.label) for b in after.approved_box_list] == [
        (st.box_list[2].box_id, (1, 2, 30, 40), "glove")
    ]
    cmd = (await store.outbox_commands(job_id))[-1]
    assert cmd.node_type == "SEGMENT_SUBJECT"  # the one approved subject's node (statecore.subjects)
    assert [b["box_id"] for b in cmd.input["approved_box_list"]] == [st.box_list[2].box_id]


# --------------------------------------------------------------------------- cancel


async def test_cancel_waiting_job_is_idempotent(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    snap = await store.cancel(job_id, "admin")
    assert snap.status == S.CANCELLED and snap.active_pause is None and snap.cancel_requested
    assert snap.version == st.version + 1 and snap.pending_actions == []
    hist = await store.pause_history(job_id)
    assert [(h.pause_token, h.status) for h in hist] == [(st.active_pause.pause_token, "CANCELLED")]
    assert await store.r.zscore(keys.job(job_id).waiting, job_id) is None
    before = await footprint(store, job_id)
    again = await store.cancel(job_id, "someone-else")
    assert again == snap
    assert await footprint(store, job_id) == before
    types = [e.type for e in await store.events_after(job_id)]
    assert types.count("JOB_CANCELLED") == 1 and types.count("JOB_FINISHED") == 1


async def test_cancel_while_node_running_then_late_report_is_ignored(store, image):
    job_id = await create(store, image)
    st = await store.get(job_id)
    node = st.current_node
    assert await store.node_started((await store.outbox_commands(job_id))[0]) == "OK"
    await store.cancel(job_id, "admin")
    after_cancel = await store.get(job_id)
    assert after_cancel.status == S.CANCELLED
    assert await store.r.zscore(keys.job(job_id).running, job_id) is None
    n_events = len(await store.events_after(job_id))
    res = await store.apply_report(
        NodeReport(
            node_instance_id=node.node_instance_id,
            node_type=node.node_type,
            job_id=job_id,
            outcome="SUCCEEDED",
            output={"boxes": THREE_BOXES},
        )
    )
    assert res == "IGNORED"
    after = await store.get(job_id)
    assert after.status == S.CANCELLED and after.version == after_cancel.version and after.box_list == []
    events = await store.events_after(job_id, n_events)
    assert [e.type for e in events] == ["REPORT_IGNORED"]
    assert events[0].data["reason"] == "JOB_TERMINAL" and events[0].data["node_instance_id"] == node.node_instance_id
    assert events[0].data["status"] == "CANCELLED"
    # A second copy of the late report is a duplicate: no second REPORT_IGNORED.
    res2 = await store.apply_report(
        NodeReport(
            node_instance_id=node.node_instance_id,
            node_type=node.node_type,
            job_id=job_id,
            outcome="SUCCEEDED",
            output={},
        )
    )
    assert res2 == "DUPLICATE"
    assert len(await store.events_after(job_id)) == n_events + 1
    assert await store.node_started((await store.outbox_commands(job_id))[0]) != "OK"


async def test_cancel_of_other_terminal_job_is_job_terminal(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, []), "rev")
    done = await store.get(job_id)
    before = await footprint(store, job_id)
    with pytest.raises(JobTerminal) as ei:
        await store.cancel(job_id, "admin")
    _assert_snapshot(ei.value, done)
    assert ei.value.snapshot["status"] == "EMPTY_SELECTION"
    assert await footprint(store, job_id) == before
