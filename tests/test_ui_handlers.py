"""The reviewer app's rules, without a server: snapshot -> panel, annotator -> subjects, 409s.

The queue, the results view and building the app are in ``test_ui_views.py``; the callbacks, called with
their components and no browser, in ``test_ui_callbacks.py``; the shared snapshots in ``tests/ui_fakes.py``.
"""

from __future__ import annotations

from hitl_review.statecore.models import (
    CurrentNode,
    SubjectResult,
)
from hitl_review.ui.annotator import (
    AUTO_TARGET,
    Edits,
    apply_label,
    box_notes,
    edits_between,
    label_choices,
    read_annotator,
    reapplied_value,
    subjects_from_annotator,
)
from hitl_review.ui.panel import (
    MANUAL_COLOR,
    MODEL_COLOR,
    PROBLEM_COLOR,
    annotator_value,
    panel_from_snapshot,
    stage_text,
    status_text,
)
from hitl_review.ui.session import ReviewerState, conflict_banner
from tests.ui_fakes import (
    WAITING_ACTIONS,
    as_raw,
    drawn,
    model_box,
    opened,
    pause,
    round1,
    round2,
    shown,
    snapshot,
)

# --------------------------------------------------------------------------- snapshot -> panel


def test_round1_panel_shows_every_box_with_label_score_and_source() -> None:
    panel = shown(panel_from_snapshot(round1()))
    assert panel is not None and panel.round == 1
    assert stage_text(panel) == "Confirm the detected subjects"
    value = annotator_value(panel, "/tmp/img.png")
    assert value["image"] == "/tmp/img.png"
    labels = [b["label"] for b in value["boxes"]]
    assert labels == ["#1 shoe · 0.92 · model", "#2 sock · 0.55 · model", "#3 hand · 0.41 · model"]
    assert {b["color"] for b in value["boxes"]} == {MODEL_COLOR}
    assert value["boxes"][0] | {} == {
        "xmin": 10.0,
        "ymin": 20.0,
        "xmax": 110.0,
        "ymax": 120.0,
        "label": labels[0],
        "color": MODEL_COLOR,
    }


def test_round2_panel_highlights_problem_boxes_with_the_reason() -> None:
    panel = shown(panel_from_snapshot(round2()))
    assert panel is not None and panel.round == 2
    assert stage_text(panel) == "These boxes did not pass naming — redraw or remove them"
    value = annotator_value(panel, "/tmp/img.png")
    by_tag = {b["label"].split(" ")[0]: b for b in value["boxes"]}
    assert by_tag["#3"]["color"] == PROBLEM_COLOR
    assert "no object inside the box" in by_tag["#3"]["label"]
    assert by_tag["#2"]["color"] == MANUAL_COLOR
    assert by_tag["#1"]["color"] == MODEL_COLOR
    notes = box_notes(panel)
    assert "**#3 ghost** — no object inside the box (score 0.12)" in notes
    assert notes.index("Did not pass naming") < notes.index("#1 shoe")


def test_no_submit_panel_outside_an_active_pause() -> None:
    detecting = snapshot(
        status="DETECTING",
        active=None,
        actions=[],
        version=2,
        node=CurrentNode(node_instance_id="node_1", node_type="DETECT_SUBJECTS", status="RUNNING", attempt=1),
    )
    assert panel_from_snapshot(detecting) is None
    assert "DETECTING" in status_text(detecting) and "DETECT_SUBJECTS" in status_text(detecting)
    # decided from active_pause / pending_actions, not from the status name
    assert panel_from_snapshot(snapshot(active=None, actions=WAITING_ACTIONS)) is None
    assert panel_from_snapshot(snapshot(active=pause(), actions=[])) is None
    consumed = pause().model_copy(update={"status": "CONSUMED"})
    assert panel_from_snapshot(snapshot(active=consumed)) is None
    for status in (
        "VALIDATING_MANUAL_BOXES",
        "PROCESSING_APPROVED_SUBJECTS",
        "SUCCEEDED",
        "CANCELLED",
        "EMPTY_SELECTION",
    ):
        snap = snapshot(status=status, active=None, actions=[], boxes=[model_box(1)], approved=[model_box(1)])
        assert panel_from_snapshot(snap) is None
        assert status in status_text(snap)
    # one node per subject: how many of them are done so far
    two = [model_box(1), model_box(2)]
    cutting = snapshot(status="PROCESSING_APPROVED_SUBJECTS", active=None, actions=[], boxes=two, approved=two)
    subjects = [
        SubjectResult(box_id=b.box_id, bbox=b.bbox, status=s) for b, s in zip(two, ("SUCCEEDED", "QUEUED"), strict=True)
    ]
    assert "cutting out 2 approved subjects… 1 of 2 done" in status_text(
        cutting.model_copy(update={"subjects": subjects})
    )
    # side by side: the subjects' own nodes, how many run and how many were retried
    running = [s.model_copy(update={"status": "SEGMENTING"}) for s in subjects]
    nodes = [
        CurrentNode(node_instance_id="node_a", node_type="SEGMENT_SUBJECT", status="RUNNING", attempt=1, box_id="a"),
        CurrentNode(node_instance_id="node_b", node_type="SEGMENT_SUBJECT", status="RETRY_WAIT", attempt=1, box_id="b"),
    ]
    text = status_text(cutting.model_copy(update={"subjects": running, "subject_nodes": nodes}))
    assert "0 of 2 done" in text and "`SEGMENT_SUBJECT` ×2: 1 running, 1 queued, 1 retried" in text
    st = ReviewerState(token="t", signed_in=True)
    st.open(snapshot(status="PROCESSING_APPROVED_SUBJECTS", active=None, actions=[], approved=[model_box(1)]))
    assert st.panel is None
    assert subjects_from_annotator(st.panel, None)[1]


# --------------------------------------------------------------------------- annotator -> subjects


def test_subjects_keep_move_delete_and_add() -> None:
    panel = shown(panel_from_snapshot(round1()))
    scale = 0.5  # the image is shown at half size in the browser
    raw = as_raw(annotator_value(panel, "/tmp/img.png"), scale)
    raw["boxes"][0]["xmin"] += 0.2  # unmoved within a pixel: keeps its exact coordinates
    raw["boxes"][1].update(xmin=190 * scale, xmax=310.4 * scale)  # moved and resized
    del raw["boxes"][2]  # deleted
    raw["boxes"].insert(0, drawn(380, 250, 450.7, 320, label="new: hat", scale=scale))  # off the image's corner
    subjects, err = subjects_from_annotator(panel, raw)
    assert err is None
    assert subjects == [
        {"box_id": "box_1", "bbox": [10.0, 20.0, 110.0, 120.0], "label": "shoe"},
        {"box_id": "box_2", "bbox": [190.0, 50.0, 310.0, 150.0], "label": "sock"},
        {"bbox": [380.0, 250.0, 400.0, 300.0], "label": "hat"},
    ]
    edits = edits_between(panel, read_annotator(panel, raw))
    assert edits.deleted == ["box_3"] and list(edits.moved) == ["box_2"] and len(edits.added) == 1


def test_preprocessed_values_work_too() -> None:
    panel = shown(panel_from_snapshot(round1()))
    value = annotator_value(panel, "/tmp/img.png")
    value["boxes"] = value["boxes"][:1]
    subjects, err = subjects_from_annotator(panel, value)
    assert err is None and subjects == [{"box_id": "box_1", "bbox": [10.0, 20.0, 110.0, 120.0], "label": "shoe"}]


def test_empty_list_is_allowed_and_means_cut_nothing() -> None:
    panel = shown(panel_from_snapshot(round1()))
    assert subjects_from_annotator(panel, {"boxes": [], "orientation": 0}) == ([], None)


def test_manual_box_without_label_is_an_inline_error() -> None:
    panel = shown(panel_from_snapshot(round1()))
    raw = as_raw(annotator_value(panel, "/tmp/img.png"))
    raw["boxes"].insert(0, drawn(5, 5, 60, 60))
    subjects, err = subjects_from_annotator(panel, raw)
    assert subjects == [] and err is not None and "needs a label" in err and "new box 1" in err


def test_rotated_image_cannot_be_submitted() -> None:
    panel = shown(panel_from_snapshot(round1()))
    raw = as_raw(annotator_value(panel, "/tmp/img.png"))
    raw["orientation"] = 1
    assert "orientation" in (subjects_from_annotator(panel, raw)[1] or "")


def test_label_entry_for_a_new_box_then_relabel_an_existing_one() -> None:
    panel = shown(panel_from_snapshot(round2()))
    raw = as_raw(annotator_value(panel, "/tmp/img.png"))
    raw["boxes"].insert(0, drawn(100, 100, 150, 160))  # older drawn box
    raw["boxes"].insert(0, drawn(300, 200, 350, 260))  # newest drawn box: first, as the annotator puts it
    choices = label_choices(panel, read_annotator(panel, raw))
    assert choices[0][1] == AUTO_TARGET and ("New box 2: (no label)", "new:2") in choices

    value, relabels, err = apply_label(panel, raw, {}, AUTO_TARGET, "  cap ", "/tmp/img.png")
    assert err is None and relabels == {} and value is not None
    assert [b["label"] for b in value["boxes"][:2]] == ["new: cap", ""]
    value, relabels, err = apply_label(panel, as_raw(value), relabels, "new:1", "scarf", "/tmp/img.png")
    assert err is None
    value, relabels, err = apply_label(panel, as_raw(value), relabels, "box:box_5", "glove", "/tmp/img.png")
    assert err is None and relabels == {"box_5": "glove"} and value is not None
    assert any(b["label"].startswith("#3 glove") and "relabelled" in b["label"] for b in value["boxes"])

    subjects, err = subjects_from_annotator(panel, as_raw(value), relabels)
    assert err is None
    assert [s.get("box_id") for s in subjects] == ["box_1", "box_4", "box_5", None, None]
    assert subjects[2]["label"] == "glove"
    assert [s["label"] for s in subjects[3:]] == ["scarf", "cap"]  # drawn boxes oldest first
    assert apply_label(panel, as_raw(value), relabels, AUTO_TARGET, "x", "/tmp/img.png")[2]  # none left
    blank = apply_label(panel, as_raw(value), relabels, AUTO_TARGET, "   ", "/tmp/img.png")
    assert blank[2] == "Type a label first."


# --------------------------------------------------------------------------- 409s


def test_version_conflict_redraws_offers_edits_and_takes_a_new_intervention_id() -> None:
    st = opened(round1())
    panel = shown(st.panel)
    raw = as_raw(annotator_value(panel, "/tmp/img.png"))
    raw["boxes"][0].update(xmin=15, xmax=115)  # move box_1
    del raw["boxes"][2]  # delete box_3
    raw["boxes"].insert(0, drawn(300, 200, 350, 260, "new: cap"))
    edits = edits_between(panel, read_annotator(panel, raw))
    first_id = st.submission_id()

    # meanwhile the job moved on: a new pause where box_1 no longer exists
    newer = snapshot(
        version=5,
        boxes=[model_box(2, (200, 50, 300, 150), "sock", 0.55), model_box(3, (50, 160, 150, 280), "hand", 0.41)],
        active=pause("pause_9", base_version=5),
    )
    outcome = st.record_conflict("VERSION_CONFLICT", newer.model_dump(mode="json"), edits)
    assert outcome.banner.startswith("Your view was out of date")
    assert outcome.redraw and shown(st.panel).pause_token == "pause_9" and st.version == 5
    assert st.intervention_id and st.intervention_id != first_id
    assert st.submission_id() == st.intervention_id
    assert outcome.offer is not None
    assert outcome.offer.deleted == ["box_3"] and outcome.offer.moved == {}
    assert outcome.offer.added == [((300.0, 200.0, 350.0, 260.0), "cap")]
    assert outcome.dropped == ["move box_1"]
    assert "Re-apply my edits" in outcome.banner

    value, relabels = reapplied_value(shown(st.panel), outcome.offer, "/tmp/img.png")
    labels = [b["label"] for b in value["boxes"]]
    assert labels[0] == "new: cap" and not any("hand" in lbl for lbl in labels)
    subjects, err = subjects_from_annotator(shown(st.panel), value, relabels)
    assert err is None and [s.get("box_id") for s in subjects] == ["box_2", None]


def test_pause_conflicts_in_plain_words() -> None:
    st = opened(round1())
    other = snapshot(status="VALIDATING_MANUAL_BOXES", version=4, active=None, actions=[], boxes=round1().box_list)
    out = st.record_conflict("PAUSE_TOKEN_MISMATCH", other.model_dump(mode="json"), Edits(deleted=["box_1"]))
    assert out.banner.startswith("Another reviewer submitted first.")
    assert st.panel is None and out.offer is None and "VALIDATING_MANUAL_BOXES" in out.banner

    # the usual race: the other submission bumped the version first, so the server says VERSION_CONFLICT
    st = opened(round1())
    mine = Edits(deleted=["box_3"], added=[((1.0, 1.0, 50.0, 50.0), "cap")])
    out = st.record_conflict("VERSION_CONFLICT", other.model_dump(mode="json"), mine)
    assert out.banner.startswith("Your view was out of date: another reviewer submitted first.")
    assert st.panel is None and st.carry is not None
    # ... and when the other reviewer's submission opens round 2, the edits are offered on it
    change = st.apply_snapshot(round2().model_copy(update={"box_list": round1().box_list[:1] + round2().box_list[1:]}))
    assert change.redraw and st.carry is None
    assert st.offer.deleted == [] and st.offer.added == [((1.0, 1.0, 50.0, 50.0), "cap")]
    assert change.banner.startswith("Another reviewer submitted the previous round. A new review round is open")
    assert "Your edits (drew 1 new) can be re-applied" in change.banner
    assert "Not re-applicable (box gone): delete box_3" in change.banner

    st = opened(round1())
    st.record_success("pause_1", "VALIDATING_MANUAL_BOXES", 4, "VALIDATE_MANUAL_BOX_LIST", 2, 1, 1)
    st.panel = panel_from_snapshot(round1())  # e.g. a stale second tab of the same session
    out = st.record_conflict("PAUSE_NOT_ACTIVE", other.model_dump(mode="json"), None)
    assert out.banner.startswith("This review was already submitted.")

    st = opened(round1())
    cancelled = snapshot(status="CANCELLED", version=4, active=None, actions=[])
    out = st.record_conflict("JOB_CANCELLED", cancelled.model_dump(mode="json"), None)
    assert out.banner.startswith("The job was cancelled") and st.panel is None
    assert conflict_banner("IDEMPOTENCY_CONFLICT").startswith("This review was already submitted")


def test_double_submit_sends_the_same_intervention_id_and_shows_one_result() -> None:
    st = opened(round1())
    first = st.submission_id()
    assert st.submission_id() == first  # second click while the first is in flight (or a retry)
    msg1 = st.record_success("pause_1", "PROCESSING_APPROVED_SUBJECTS", 4, "PROCESS_APPROVED_BOX_LIST", 3, 0, 0)
    msg2 = st.record_success("pause_1", "PROCESSING_APPROVED_SUBJECTS", 4, "PROCESS_APPROVED_BOX_LIST", 3, 0, 0)
    assert msg1 == msg2 and list(st.results) == ["pause_1"] and st.last_result == msg1
    assert st.panel is None and st.snapshot is not None and st.snapshot.status == "PROCESSING_APPROVED_SUBJECTS"
    assert st.intervention_id is None
    st.open(round2())
    assert st.submission_id() != first


def test_events_from_others_close_the_panel_with_a_banner_but_own_submission_does_not() -> None:
    st = opened(round1())
    after = snapshot(status="VALIDATING_MANUAL_BOXES", version=4, active=None, actions=[])
    change = st.apply_snapshot(after)
    assert change.redraw and change.banner == "Another reviewer submitted first."
    assert not st.apply_snapshot(round1()).applied  # older than what is shown
    change = st.apply_snapshot(round2())  # the other reviewer's boxes failed naming: round 2 opens
    assert change.redraw and change.banner is not None
    assert change.banner.startswith("Another reviewer submitted the previous round.")

    st = opened(round1())
    st.record_success("pause_1", "VALIDATING_MANUAL_BOXES", 4, "VALIDATE_MANUAL_BOX_LIST", 2, 1, 0)
    change = st.apply_snapshot(after)
    assert change.applied and change.banner is None
    change = st.apply_snapshot(round2())  # the round-2 pause opens
    # the banner no longer says "now VALIDATING…": it says the review counted and why a panel is back
    assert change.redraw and shown(st.panel).round == 2
    assert change.banner == "Your review was accepted; 1 box did not pass naming — round 2 is open below."
    assert st.notice == change.banner


def test_own_submission_in_flight_is_not_taken_for_another_reviewers() -> None:
    """The follower can see the pause consumed before the submission's own answer is recorded: while it is in
    flight (``sending``) the follower says nothing about it, and the answer says what came of it."""
    st = opened(round1())
    st.sending = "pause_1"
    after = snapshot(status="VALIDATING_MANUAL_BOXES", version=4, active=None, actions=[])
    change = st.apply_snapshot(after)
    assert change.applied and change.banner is None and st.notice is None and st.panel is None
    st.sending = None
    msg = st.record_success("pause_1", "VALIDATING_MANUAL_BOXES", 4, "VALIDATE_MANUAL_BOX_LIST", 2, 1, 0)
    assert msg.startswith("Submitted") and st.notice == msg


def test_a_quorum_vote_keeps_the_panel_closed_while_the_pause_waits_for_others() -> None:
    st = opened(round1())
    vote = {"needed": 2, "received": 1, "reviewers": ["rev1"], "outcome": "VOTE_RECORDED"}
    st.record_success("pause_1", "WAITING_USER_SELECTION", 3, None, 3, 0, 0, vote)
    assert st.panel is None
    # The vote's event brings the job back: same pause, same version (a vote does not move it).
    change = st.apply_snapshot(round1())
    assert change.applied and not change.redraw and st.panel is None  # nothing to claim or renew
    # The quorum disagreed: the reconciliation pause is a new one, and it opens.
    change = st.apply_snapshot(round2())
    assert change.redraw and shown(st.panel).round == 2


def test_the_end_of_the_job_replaces_the_submission_message() -> None:
    st = opened(round1())
    st.record_success("pause_1", "PROCESSING_APPROVED_SUBJECTS", 4, "PROCESS_APPROVED_BOX_LIST", 3, 0, 0)
    running = snapshot(status="PROCESSING_APPROVED_SUBJECTS", version=4, active=None, actions=[])
    assert st.apply_snapshot(running).banner is None
    done = snapshot(status="SUCCEEDED", version=6, active=None, actions=[])
    change = st.apply_snapshot(done)
    assert change.applied and change.banner == "The job ended: SUCCEEDED." and st.notice == change.banner
    assert st.apply_snapshot(snapshot(status="SUCCEEDED", version=7, active=None, actions=[])).banner is None


def test_reopening_the_same_pause_keeps_the_pending_intervention_id() -> None:
    st = opened(round1())
    iv = st.submission_id()
    st.open(round1())  # a reload of the same review: a retry must not count twice
    assert st.intervention_id == iv
    st.open(round2())
    assert st.intervention_id is None
