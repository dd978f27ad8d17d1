"""The reviewer app's rules, without a server: snapshot -> panel, annotator -> subjects, 409s, queue, results;
then the callbacks, called with their components and no browser."""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image

from client import HitlClient, new_intervention_id
from harness.tokens import TOKENS
from serve_app.samples import product_composite
from statecore.models import (
    BBox,
    Box,
    CurrentNode,
    ImageRef,
    JobResults,
    JobSnapshot,
    JobSummary,
    Pause,
    SubjectResult,
    Validation,
)
from ui.annotator import (
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
from ui.callbacks import Callbacks, show
from ui.images import ImageStore
from ui.layout import Components, layout
from ui.panel import (
    MANUAL_COLOR,
    MODEL_COLOR,
    PROBLEM_COLOR,
    ROUND1_TEXT,
    Panel,
    annotator_value,
    backends_text,
    panel_from_snapshot,
    panel_image_name,
    stage_text,
    status_text,
)
from ui.queue import format_age, next_job_id, queue_rows
from ui.results import results_view
from ui.session import ReviewerState, conflict_banner

W, H = 400, 300
IMAGE = ImageRef(sha256="ab" * 32, width=W, height=H, url="/api/v1/artifacts/img.png")
WAITING_ACTIONS = ["SUBMIT_BOX_LIST", "DRAW_MANUAL_BOX"]


def model_box(
    i: int, bbox: BBox = (10.0, 20.0, 110.0, 120.0), label: str | None = "shoe", score: float | None = 0.92
) -> Box:
    return Box(box_id=f"box_{i}", bbox=bbox, label=label, score=score, source="model")


def manual_box(i: int, bbox: BBox, label: str | None, validation: Validation | None = None) -> Box:
    return Box(box_id=f"box_{i}", bbox=bbox, label=label, score=None, source="manual", validation=validation)


def pause(
    token: str = "pause_1",
    stage: str = "WAITING_USER_SELECTION",
    round_: int = 1,
    base_version: int = 3,
    revise: Sequence[str] = (),
) -> Pause:
    return Pause(
        pause_token=token,
        status="WAITING",
        stage=stage,
        base_version=base_version,
        round=round_,
        snapshot_id="snap_1",
        box_ids_to_revise=list(revise),
        created_at="2026-05-21T10:00:00Z",
    )


def snapshot(
    status: str = "WAITING_USER_SELECTION",
    boxes: Sequence[Box] = (),
    active: Pause | None = None,
    actions: Sequence[str] = WAITING_ACTIONS,
    version: int = 3,
    job_id: str = "job_1",
    node: CurrentNode | None = None,
    approved: Sequence[Box] = (),
) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id,
        status=status,
        version=version,
        round=active.round if active else 1,
        created_at="2026-05-21T09:59:00Z",
        updated_at="2026-05-21T10:00:00Z",
        image=IMAGE,
        box_list=list(boxes),
        approved_box_list=list(approved),
        active_pause=active,
        pending_actions=list(actions),
        current_node=node,
    )


def round1() -> JobSnapshot:
    return snapshot(
        boxes=[
            model_box(1),
            model_box(2, (200, 50, 300, 150), "sock", 0.55),
            model_box(3, (50, 160, 150, 280), "hand", 0.41),
        ],
        active=pause(),
    )


def round2() -> JobSnapshot:
    bad = Validation(status="NEEDS_REVISION", score=0.12, reason="no object inside the box")
    ok = Validation(status="PASSED", score=0.9, reason=None)
    return snapshot(
        status="WAITING_BOX_BATCH_REVISION",
        version=6,
        boxes=[
            model_box(1),
            manual_box(4, (220, 40, 320, 140), "hat", ok),
            manual_box(5, (0, 0, 40, 40), "ghost", bad),
        ],
        active=pause("pause_2", "WAITING_BOX_BATCH_REVISION", 2, 6, revise=["box_5"]),
    )


def as_raw(value: dict[str, Any] | None, scale: float = 1.0) -> dict[str, Any]:
    """What the browser sends back: canvas units plus each box's scaleFactor, colours as CSS text."""
    assert value is not None
    boxes = []
    for b in value["boxes"]:
        r, g, bl = b["color"]
        boxes.append(
            {
                "label": b["label"],
                "xmin": b["xmin"] * scale,
                "ymin": b["ymin"] * scale,
                "xmax": b["xmax"] * scale,
                "ymax": b["ymax"] * scale,
                "color": f"rgb({r}, {g}, {bl})",
                "scaleFactor": scale,
            }
        )
    return {"image": {"path": "/tmp/x.png"}, "boxes": boxes, "orientation": 0}


def drawn(xmin: float, ymin: float, xmax: float, ymax: float, label: str = "", scale: float = 1.0) -> dict[str, Any]:
    return {
        "label": label,
        "xmin": xmin * scale,
        "ymin": ymin * scale,
        "xmax": xmax * scale,
        "ymax": ymax * scale,
        "color": "rgb(234, 88, 12)",
        "scaleFactor": scale,
    }


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


def shown(panel: Panel | None) -> Panel:
    """The panel, which the test expects to be there."""
    assert panel is not None
    return panel


def opened(snap: JobSnapshot) -> ReviewerState:
    st = ReviewerState(token="t", signed_in=True)
    st.open(snap)
    return st


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
    assert change.redraw and change.banner == "" and shown(st.panel).round == 2  # clears the old message


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


# --------------------------------------------------------------------------- queue


def summary(
    job_id: str, paused_at: str | None, stage: str | None = "WAITING_USER_SELECTION", boxes: int = 2
) -> JobSummary:
    return JobSummary(
        job_id=job_id,
        status=stage or "DETECTING",
        version=3,
        created_at="2026-05-21T09:00:00Z",
        updated_at="2026-05-21T09:00:00Z",
        submitter="alice",
        box_count=boxes,
        stage=stage,
        pause_created_at=paused_at,
    )


def test_queue_rows_oldest_pause_first() -> None:
    jobs = [
        summary("job_b", "2026-05-21T10:00:00Z"),
        summary("job_a", "2026-05-21T09:58:55Z", "WAITING_BOX_BATCH_REVISION", 1),
        summary("job_c", "2026-05-21T08:00:00Z"),
        summary("job_d", None, None),
    ]  # not waiting
    now = datetime(2026, 5, 21, 10, 0, 30, tzinfo=UTC)
    assert queue_rows(jobs, now) == [
        ["job_c", "WAITING_USER_SELECTION", "2 h 00 min", 2],
        ["job_a", "WAITING_BOX_BATCH_REVISION", "1 min 35 s", 1],
        ["job_b", "WAITING_USER_SELECTION", "30 s", 2],
    ]
    assert next_job_id(jobs) == "job_c"
    assert next_job_id(jobs, exclude=["job_c"]) == "job_a"
    assert next_job_id([summary("job_d", None, None)]) is None
    assert format_age(3 * 86400 + 7200) == "3 d 2 h"


# --------------------------------------------------------------------------- results


def rgb(img: Image.Image, xy: tuple[int, int]) -> tuple[int, ...]:
    pixel = img.getpixel(xy)
    assert isinstance(pixel, tuple)
    return pixel


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def test_results_view_cutouts_on_checkerboard_and_mask_overlays(tmp_path: Path) -> None:
    cutout = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
    cutout.paste((10, 200, 10, 255), (10, 10, 30, 20))
    mask = Image.new("L", (W, H), 0)
    mask.paste(255, (10, 20, 110, 120))
    artifacts = {"/api/v1/artifacts/c1.png": png(cutout), "/api/v1/artifacts/m1.png": png(mask)}
    res = JobResults(
        job_id="job_1",
        status="PARTIAL_SUCCEEDED",
        subjects=[
            SubjectResult(
                box_id="box_1",
                bbox=(10, 20, 110, 120),
                label="shoe",
                status="SUCCEEDED",
                mask_url="/api/v1/artifacts/m1.png",
                cutout_url="/api/v1/artifacts/c1.png",
            ),
            SubjectResult(
                box_id="box_5", bbox=(0, 0, 40, 40), label="ghost", status="REJECTED", reason="no object inside the box"
            ),
        ],
    )
    image = png(Image.new("RGB", (W, H), (255, 255, 255)))
    view = results_view(res, artifacts.__getitem__, image, tmp_path / "out")
    assert "PARTIAL_SUCCEEDED" in view.summary and "1 of 2" in view.summary
    assert "REJECTED: ghost (box_5) — no object inside the box" in view.summary
    assert [c for _, c in view.cutouts] == ["shoe — box_1"]
    preview = Image.open(view.cutouts[0][0])
    assert preview.mode == "RGB" and preview.getpixel((0, 0)) in {(204, 204, 204), (255, 255, 255)}
    assert preview.getpixel((15, 15)) == (10, 200, 10)
    overlay = Image.open(view.overlays[0][0])
    inside, outside = rgb(overlay, (50, 50)), rgb(overlay, (300, 250))
    assert inside != (255, 255, 255) and sum(inside) > sum(outside) and outside == (89, 89, 89)
    assert sorted(Path(f).name for f in view.files) == ["shoe_box_1_cutout.png", "shoe_box_1_mask.png"]
    assert Path(view.files[0]).read_bytes() in artifacts.values()


def test_backends_line() -> None:
    assert (
        backends_text({"backends": {"detector": "classical", "segmenter": "sam"}})
        == "Model backends: detector = `classical`, segmenter = `sam`"
    )
    assert backends_text({}) == ""


# --------------------------------------------------------------------------- app


def test_build_app_builds_blocks_without_a_server() -> None:
    from ui.app import build_app

    demo = build_app("http://127.0.0.1:9", token="x")
    assert isinstance(demo, gr.Blocks)
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    for elem_id in (
        "queue-table",
        "job-id",
        "stage-text",
        "banner",
        "submit-btn",
        "cut-nothing-btn",
        "cancel-job-btn",
        "confirm-cut-nothing-btn",
        "confirm-cancel-btn",
        "new-box-label",
        "results-gallery",
        "annotator",
    ):
        assert elem_id in ids
    assert isinstance(build_app("http://127.0.0.1:9", require_login=True), gr.Blocks)


def test_a_stale_view_is_read_against_the_panel_it_showed() -> None:
    st = opened(round1())
    name = panel_image_name(shown(st.panel), ".png")
    assert name == f"{IMAGE.sha256}__pause_1.png"
    stale = as_raw(annotator_value(shown(st.panel), f"/tmp/{name}"))
    stale["image"] = {"path": f"/tmp/gradio/0f3a/{name}", "orig_name": name}  # as the browser sends it back
    stale["boxes"].insert(0, drawn(60, 80, 220, 300, "new: red block"))
    st.apply_snapshot(round2())  # the follower already moved to round 2 when the click is handled
    panel = shown(st.panel_for(stale))
    assert panel.pause_token == "pause_1" and shown(st.panel).pause_token == "pause_2"
    subjects, err = subjects_from_annotator(panel, stale)
    # read against round 1: nothing of round 2 (box_4, box_5) is taken as deleted or kept
    assert err is None and [s.get("box_id") for s in subjects] == ["box_1", "box_2", "box_3", None]
    out = st.record_conflict(
        "VERSION_CONFLICT",
        round2().model_dump(mode="json"),
        edits_between(panel, read_annotator(panel, stale)),
        submitted=panel,
    )
    assert out.banner.startswith("Your view was out of date: another reviewer submitted first.")
    assert out.offer is not None
    assert out.offer.added == [((60.0, 80.0, 220.0, 300.0), "red block")] and out.offer.deleted == []
    assert st.panel_for(None) is st.panel and st.panel_for({"image": "/tmp/x.png"}) is st.panel
    assert st.panel_for({"image": f"/tmp/{IMAGE.sha256}__pause_unknown.png"}) is None


# --------------------------------------------------------------------------- callbacks, no browser


def make_callbacks(api_url: str, root: Path) -> tuple[Components, Callbacks]:
    """The page's components and handlers, as ``build_app`` makes them, without serving anything."""
    with gr.Blocks():
        comps = layout(token=None, require_login=False)
    return comps, Callbacks(comps, api_url, ImageStore(root))


def visible(update: Any) -> bool:
    return bool(update["visible"])


def test_callbacks_draw_label_and_refuse_an_unlabelled_box_without_a_server(tmp_path: Path) -> None:
    comps, cb = make_callbacks("http://127.0.0.1:9", tmp_path / "ui")
    st = opened(round1())
    cb.store.image_dir.mkdir(parents=True)
    Image.new("RGB", (W, H), (250, 250, 250)).save(cb.store.image_dir / f"{IMAGE.sha256}.png")
    assert cb.store.ensure(st, cb.clients.get(st.token)) == st.image_path  # already here: no download

    out = cb.view(st, redraw=True, banner="", error="")
    assert "Confirm the detected subjects" in out[comps.stage_md] and "pause_1" in out[comps.stage_md]
    assert visible(out[comps.review_col]) and visible(out[comps.cancel_btn])
    assert not visible(out[comps.results_col]) and not visible(out[comps.reapply_btn])
    value = out[comps.annotator]
    assert Path(value["image"]).name == f"{IMAGE.sha256}__pause_1.png" and Path(value["image"]).exists()
    assert "#1 shoe" in out[comps.notes_md] and out[comps.current_job] == "job_1"

    raw = as_raw(value)
    raw["boxes"].insert(0, drawn(300, 200, 350, 260))
    out = cb.on_annotator_change(st, raw, AUTO_TARGET)
    assert "1 new box still needs a label" in out[comps.notes_md]
    assert ("New box 1: (no label)", "new:1") in out[comps.label_target]["choices"]
    out = cb.on_submit(st, raw)
    assert "needs a label" in out[comps.review_error] and st.intervention_id is None  # nothing was sent

    out = cb.on_apply_label(st, raw, AUTO_TARGET, "cap")
    assert out[comps.annotator]["boxes"][0]["label"] == "new: cap" and out[comps.label_text] == ""
    assert cb.on_apply_label(st, raw, AUTO_TARGET, " ")[comps.review_error] == "Type a label first."

    # a 409 offers the edits again; re-applying puts them on the canvas of the new panel
    edits = edits_between(shown(st.panel), read_annotator(shown(st.panel), as_raw(out[comps.annotator])))
    st.record_conflict("VERSION_CONFLICT", round1().model_copy(update={"version": 4}), edits)
    out = cb.view(st, redraw=True)
    assert visible(out[comps.reapply_btn])
    out = cb.on_reapply(st)
    assert out[comps.annotator]["boxes"][0]["label"] == "new: cap" and not visible(out[comps.reapply_btn])
    assert out[comps.banner_md].startswith("Your edits were re-applied")


def test_callbacks_with_nothing_open(tmp_path: Path) -> None:
    comps, cb = make_callbacks("http://127.0.0.1:9", tmp_path / "ui")
    st = ReviewerState(token="t", signed_in=True)
    assert cb.on_submit(st, None)[comps.banner_md] == "Nothing is waiting for review on this job."
    assert comps.banner_md in cb.on_cancel(st)  # skipped: no job to cancel
    assert cb.open_job(st, "  ")[comps.banner_md] == "No job id."
    assert cb.on_tick(ReviewerState())[comps.queue_note] is not None  # not signed in: the queue is skipped
    out = cb.view(st)
    assert out[comps.job_md].startswith("No job open") and not visible(out[comps.review_col])
    assert show((comps.cut_confirm, True))()[comps.cut_confirm]["visible"] is True


# --------------------------------------------------------------------------- callbacks against the control plane


async def updates(
    follower: AsyncGenerator[dict[Any, Any], None], until: Callable[[dict[Any, Any]], bool], timeout: float = 60
) -> list[dict[Any, Any]]:
    """What a follower yields, up to the first update ``until`` accepts (or its end)."""
    out: list[dict[Any, Any]] = []
    async with contextlib.aclosing(follower), asyncio.timeout(timeout):
        async for u in follower:
            out.append(u)
            if until(u):
                break
    return out


def waiting_job(api_url: str, seed: int) -> str:
    with HitlClient(api_url, TOKENS["sub1"]) as sub:
        job = sub.submit(product_composite(seed, 320, 240, n=2)[0]).job_id
        sub.wait_for(job, ["WAITING_USER_SELECTION"], timeout=60)
    return job


def test_callbacks_open_submit_and_follow_the_job_to_its_results(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 31)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)

    queue = cb.on_tick(st)
    assert job in list(queue[comps.queue_table]["Job"]) and "waiting" in queue[comps.queue_note]
    out = cb.on_queue_select(st, gr.SelectData(None, {"index": [0, 0], "value": job, "row_value": [job]}))
    assert job in out[comps.job_md] and visible(out[comps.review_col])
    assert ROUND1_TEXT in out[comps.stage_md]
    assert Path(st.image_path or "").exists()

    out = cb.on_submit(st, out[comps.annotator])  # every detected box, as shown
    assert out[comps.banner_md].startswith("Submitted — kept 2, added 0, deleted 0.")
    assert not visible(out[comps.review_col])

    done = asyncio.run(updates(cb.follow(st, None), until=lambda u: comps.results_md in u))  # type: ignore[arg-type]
    last = done[-1]
    assert last[comps.banner_md] == "The job ended: SUCCEEDED." and "SUCCEEDED" in last[comps.status_md]
    assert "2 of 2 subjects cut out" in last[comps.results_md] and len(last[comps.results_gallery]) == 2
    assert not visible(last[comps.cancel_btn])


def test_follower_tells_when_another_reviewer_submits_first(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 32)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    assert visible(cb.open_job(st, job)[comps.review_col])
    pause = st.panel
    assert pause is not None

    def other_reviewer_cuts_nothing() -> None:
        with HitlClient(api_server.url, TOKENS["rev2"]) as rev2:
            rev2.intervene(
                job,
                intervention_id=new_intervention_id(),
                pause_token=pause.pause_token,
                base_version=pause.base_version,
                subjects=[],
            )

    timer = threading.Timer(1.5, other_reviewer_cuts_nothing)  # while the follower streams
    timer.start()
    try:
        got = asyncio.run(updates(cb.follow(st, None), until=lambda u: False))  # type: ignore[arg-type]
    finally:
        timer.cancel()
    assert got, "the follower saw nothing"
    first = got[0]
    assert first[comps.banner_md] == "Another reviewer submitted first." and not visible(first[comps.review_col])
    assert "EMPTY_SELECTION" in got[-1][comps.status_md] and "chose to cut nothing" in got[-1][comps.results_md]
    # one follower per opened job: a second call for the same opening returns at once
    assert asyncio.run(updates(cb.follow(st, None), until=lambda u: False, timeout=5)) == []  # type: ignore[arg-type]


def test_closing_the_tab_stops_its_followers(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 33)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    cb.open_job(st, job)
    tab = gr.Request(session_hash="tab-1")

    async def follow_then_close() -> list[dict[Any, Any]]:
        follower = asyncio.ensure_future(updates(cb.follow(st, tab), until=lambda u: False, timeout=30))
        await asyncio.sleep(1.0)
        cb.on_unload(tab)
        return await follower

    assert asyncio.run(follow_then_close()) == []  # ended by the unload, well before its timeout
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:
        admin.cancel(job)
