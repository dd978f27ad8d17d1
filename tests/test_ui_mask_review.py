"""The mask-review panel of the reviewer page (ui.mask_review, ui.mask_render, ui.mask_review_view):
its pure rules first (which subjects, the decisions, what is sent, what still applies after a redraw,
the browser's draft, the pictures and the clicks), then its handlers with their components and a
fake client, no server and no browser (a real one: tests/test_mask_review_browser.py)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from PIL import Image

from hitl_review.client import ConflictError, RateLimitedError
from hitl_review.client.wire import InterventionResult
from hitl_review.statecore.models import Claim, JobSnapshot, Pause, QualityVerdict
from hitl_review.statecore.states import JobStatus
from hitl_review.ui.editor import STAGE_NAMES, stage_choices
from hitl_review.ui.images import ImageStore
from hitl_review.ui.layout import Components, layout
from hitl_review.ui.mask_render import clicks_from, cutout_view, picture_of, subject_view, window_for
from hitl_review.ui.mask_review import (
    MASK_STAGE,
    MAX_POINTS,
    Decision,
    MaskReview,
    Point,
    Preview,
    carry_over,
    draft_message,
    mask_panel_from_snapshot,
    quality_md,
    restore_draft,
    subject_choices,
    submitted_text,
    summary_md,
)
from hitl_review.ui.mask_review_view import ReviewerCallbacks
from hitl_review.ui.panel import STAGE_TEXT, panel_from_snapshot
from hitl_review.ui.pump import apply_and_render
from hitl_review.ui.session import ReviewerState
from hitl_review.ui.shown import is_shown
from tests.ui_fakes import IMAGE, H, W, model_box, round1, snapshot

FAIL = {
    "verdict": "FAIL",
    "reasons": ["the mask stops 24% of the box short of one side — it may be only part of the subject"],
    "scores": {"fill": 0.41, "contrast": 0.26},
    "policy": "gate-v1",
    "severity": 0.4,
}
BOXES = {
    "box_1": (10.0, 20.0, 110.0, 120.0),
    "box_2": (200.0, 50.0, 300.0, 150.0),
    "box_3": (50.0, 160.0, 150.0, 280.0),
}


def subject(box_id: str, mask: str | None = None, bbox: tuple[float, ...] | None = None) -> dict[str, Any]:
    return {
        "box_id": box_id,
        "label": {"box_1": "shoe", "box_2": "sock", "box_3": "hand"}[box_id],
        "bbox": list(bbox or BOXES[box_id]),
        "mask_url": f"/api/v1/artifacts/{mask or box_id + '_mask.png'}",
        "cutout_url": f"/api/v1/artifacts/{box_id}_cutout.png",
        "quality": FAIL,
    }


def mask_snapshot(
    subjects: list[dict[str, Any]] | None = None, token: str = "pause_m1", version: int = 9, job_id: str = "job_1"
) -> JobSnapshot:
    listed = subjects if subjects is not None else [subject("box_1"), subject("box_2"), subject("box_3")]
    active = Pause.model_validate(
        {
            "pause_token": token,
            "status": "WAITING",
            "stage": MASK_STAGE,
            "base_version": version,
            "round": 1,
            "snapshot_id": "snap_" + "0" * 20,
            "created_at": "2026-05-21T10:00:00Z",
            "subjects_to_review": listed,
        }
    )
    boxes = [model_box(i + 1, BOXES[f"box_{i + 1}"]) for i in range(3)]
    return snapshot(
        status=MASK_STAGE, boxes=boxes, active=active, actions=["DECIDE_SUBJECT_MASKS"], version=version, job_id=job_id
    )


def review_of(snap: JobSnapshot | None = None) -> MaskReview:
    panel = mask_panel_from_snapshot(snap or mask_snapshot())
    assert panel is not None
    return MaskReview(panel)


# --------------------------------------------------------------------------- the pure rules


def test_a_mask_pause_is_a_mask_panel_never_a_box_panel_and_its_stage_has_a_name() -> None:
    snap = mask_snapshot()
    panel = mask_panel_from_snapshot(snap)
    assert panel is not None and [s.box_id for s in panel.subjects] == ["box_1", "box_2", "box_3"]
    assert panel.subjects[0].name == "#1 shoe" and panel.subjects[0].quality is not None
    assert panel.pause_token == "pause_m1" and panel.base_version == 9
    assert panel_from_snapshot(snap) is None
    snap.pending_actions.append("SUBMIT_BOX_LIST")  # whatever the actions say: a mask pause has no boxes to edit
    assert panel_from_snapshot(snap) is None
    assert mask_panel_from_snapshot(round1()) is None and mask_panel_from_snapshot(mask_snapshot([])) is None
    assert STAGE_NAMES[MASK_STAGE] == "Review cut-outs" and ("Review cut-outs", MASK_STAGE) in stage_choices()
    assert MASK_STAGE in STAGE_TEXT


def test_every_subject_needs_one_complete_decision_before_anything_is_sent() -> None:
    r = review_of()
    assert not r.complete and len(r.problems()) == 3 and "0 of 3 decided" in summary_md(r)
    r.decide("ACCEPT")
    assert r.next_undecided() and r.subject.box_id == "box_2"
    r.decide("REJECT")
    assert "Reject needs a reason" in " ".join(r.problems())
    r.decide("REJECT", "  cut in half  ")
    r.go(1)
    r.decide("REFINE")
    assert r.problems() == ["#3 hand: Refine needs at least one point on the image"]
    assert r.add_point(W + 5, 10, True) == "That click is outside the image." and not r.decision().points
    assert r.add_point(60, 200, True) is None and r.add_point(70, 210, False) is None
    assert r.complete and not r.next_undecided() and "3 of 3 decided" in summary_md(r)
    assert r.payload() == [
        {"box_id": "box_1", "decision": "ACCEPT", "reason": None, "points": []},
        {"box_id": "box_2", "decision": "REJECT", "reason": "cut in half", "points": []},
        {
            "box_id": "box_3",
            "decision": "REFINE",
            "reason": None,
            "points": [{"x": 60.0, "y": 200.0, "positive": True}, {"x": 70.0, "y": 210.0, "positive": False}],
        },
    ]
    assert r.counts() == {"ACCEPT": 1, "REJECT": 1, "REFINE": 1}
    labels = [label for label, _ in subject_choices(r)]
    assert labels[0].endswith("Accept") and "“cut in half”" in labels[1] and "Refine: 2 points" in labels[2]
    # Switching to Accept keeps the points (nothing clicked is lost) but sends none.
    r.decide("ACCEPT")
    assert r.payload()[2]["points"] == [] and len(r.decision().points) == 2
    r.decide("REFINE")
    assert r.undo_point() and len(r.decision().points) == 1
    r.clear_points()
    assert not r.undo_point() and not r.complete


def test_at_most_max_points_and_a_late_preview_never_replaces_a_newer_one() -> None:
    r = review_of()
    for i in range(MAX_POINTS):
        assert r.add_point(1 + i, 1, True) is None
    assert "At most" in (r.add_point(5, 5, True) or "")
    r = review_of()
    r.add_point(50, 50, True)
    one = tuple(r.decision().points)
    r.add_point(60, 60, False)
    two = tuple(r.decision().points)

    def pv(points: tuple[Point, ...]) -> Preview:
        return Preview("box_1", points, b"png", 100, None, 12.0)

    assert r.keep_preview(pv(two)) and r.preview() is not None
    assert not r.keep_preview(pv(one))  # the first click's answer came last: the newer stays
    assert r.preview() is not None and r.preview() == pv(two)
    r.undo_point()
    assert r.preview() is None  # made for points the subject no longer has
    assert r.keep_preview(pv(one)) and r.preview() == pv(one)


def test_decisions_that_still_apply_are_kept_when_the_panel_is_redrawn() -> None:
    r = review_of()
    r.decide("ACCEPT")
    r.go(1)
    r.decide("REJECT", "cut in half")
    r.go(1)
    r.add_point(60, 200, True)
    # The new pause: box_1's mask changed, box_2 is the same, box_3 moved, and box_1 comes first still.
    new = mask_panel_from_snapshot(
        mask_snapshot(
            [subject("box_1", mask="other.png"), subject("box_2"), subject("box_3", bbox=(40, 150, 150, 280))],
            token="pause_m2",
        )
    )
    assert new is not None
    again, kept, dropped = carry_over(r, new)
    assert kept == ["#2 sock"] and sorted(dropped) == ["#1 shoe", "#3 hand"]
    assert again.decision("box_2").kind == "REJECT" and again.decision("box_2").reason == "cut in half"
    assert again.decision("box_1").kind is None and again.decision("box_3").kind is None
    assert again.subject.box_id == "box_3"  # the subject on screen stays on screen
    # Refine points go with the box: same box, another mask, they still apply.
    same_box = mask_panel_from_snapshot(mask_snapshot([subject("box_3", mask="again.png")], token="pause_m3"))
    assert same_box is not None
    kept3 = carry_over(r, same_box)[0].decision("box_3")
    assert kept3.kind == "REFINE" and kept3.points == [Point(60, 200, True)]


def test_the_browser_keeps_the_decisions_per_job_and_pause_and_checks_them_on_the_way_back() -> None:
    r = review_of()
    r.decide("REJECT", "blurry")
    r.go(2)
    r.add_point(60, 200, False)
    msg = json.loads(draft_message(r, r.panel))
    assert msg["key"] == "hitl-draft:mask:job_1:pause_m1" and set(msg["draft"]["decisions"]) == {"box_1", "box_3"}
    raw = json.dumps({**msg, "saved_at": 1})
    restored = restore_draft(raw, r.panel)
    assert restored is not None
    again, kept, dropped = restored
    assert again.decision("box_1") == Decision("REJECT", "blurry", [])
    assert again.decision("box_3") == Decision("REFINE", "", [Point(60, 200, False)])
    assert kept == ["#1 shoe", "#3 hand"] and dropped == []
    other = mask_panel_from_snapshot(mask_snapshot(token="pause_other"))
    assert other is not None and restore_draft(raw, other) is None  # another round's draft
    for bad in ("", "{", "[]", json.dumps({**msg, "draft": {"decisions": {"box_1": {"decision": "DROP"}}}})):
        assert restore_draft(bad, r.panel) is None
    forget = json.loads(draft_message(r, r.panel, forget=True))
    assert forget["draft"] is None and forget["key"] == msg["key"]


def test_the_gates_reasons_and_scores_in_words() -> None:
    counts = {"ACCEPT": 2, "REJECT": 1, "REFINE": 0}
    said = submitted_text(counts, "FINALIZING_RESULTS", "FINALIZE_RESULTS")
    assert said.startswith("Decisions submitted — 2 accepted, 1 rejected, 0 to refine.") and "FINALIZING" in said
    vote = {"outcome": "VOTE_RECORDED", "received": 1, "needed": 2, "reviewers": ["rev1"]}
    assert "1 of 2 reviewers" in submitted_text(counts, MASK_STAGE, None, vote)
    text = quality_md(QualityVerdict.model_validate(FAIL))
    assert "FAIL" in text and "gate-v1" in text and "stops 24% of the box short" in text and "contrast 0.26" in text
    assert "no verdict" in quality_md(None)


def test_a_click_on_the_picture_maps_back_to_the_images_pixels() -> None:
    win = window_for((100, 50, 200, 250), 400, 300)
    assert (win.x0, win.y0, win.x1, win.y1) == (75, 0, 225, 300) and win.size[1] == 560
    x, y = win.to_image(*win.to_view(150.0, 120.0))
    assert abs(x - 150) < 1e-6 and abs(y - 120) < 1e-6
    tiny = window_for((10, 10, 20, 20), 400, 300)
    assert tiny.scale == 4.0 and tiny.x0 == 0  # small boxes are magnified at most 4 times
    src = "http://h/gradio_api/file=/tmp/gradio/ab12/pause_m1__box_2__9f3a_view.png"
    assert picture_of(src) == ("pause_m1", "box_2") and picture_of("/x/other.png") is None
    raw = json.dumps([{"x": 3, "y": "4.5", "positive": False, "src": src}, {"x": "nan?"}, 7])
    assert clicks_from(raw) == [{"x": 3.0, "y": 4.5, "positive": False, "src": src}]
    assert clicks_from("not json") == [] and clicks_from(None) == []


def test_the_pictures_show_the_mask_the_box_and_the_points() -> None:
    image = Image.new("RGB", (W, H), (240, 240, 240))
    mask = Image.new("L", (W, H), 0)
    mask.paste(255, (30, 40, 90, 100))
    bbox = BOXES["box_1"]
    win = window_for(bbox, W, H)
    points = [Point(60, 70, True), Point(100, 30, False)]
    view = subject_view(image, mask, bbox, points, win)
    assert view.size == win.size
    px = view.getpixel(tuple(int(v) for v in win.to_view(60, 70)))
    assert px == (22, 163, 74)  # a green dot on the subject
    assert view.getpixel(tuple(int(v) for v in win.to_view(100, 30))) == (220, 38, 38)  # a red one off it
    inside = view.getpixel(tuple(int(v) for v in win.to_view(45, 90)))
    outside = view.getpixel(tuple(int(v) for v in win.to_view(105, 110)))
    assert isinstance(inside, tuple) and inside[0] > inside[1] + 40  # tinted
    assert outside == (144, 144, 144)  # dimmed
    made = cutout_view(image, mask, None, bbox)
    assert made is not None and made.size == (280, 280)
    rgba = Image.new("RGBA", (W, H), (0, 0, 0, 0))
    assert cutout_view(image, None, rgba, bbox) is not None and cutout_view(None, None, None, bbox) is None


# --------------------------------------------------------------------------- the handlers, no server


class FakeClient:
    """What the handlers call, answered from memory; every call is recorded."""

    def __init__(self, snap: JobSnapshot) -> None:
        self.snap = snap
        self.calls: list[tuple[str, Any]] = []
        self.refuse: Exception | None = None
        self.preview_error: Exception | None = None

    def _png(self, mode: str) -> bytes:
        buf = io.BytesIO()
        img = Image.new(mode, (W, H), 0)
        img.paste(255 if mode == "L" else (200, 10, 10, 255), (20, 30, 100, 110))
        img.save(buf, "PNG")
        return buf.getvalue()

    def get_job(self, job_id: str) -> JobSnapshot:
        return self.snap

    def claim(self, job_id: str, *, force: bool = False) -> Claim:
        self.calls.append(("claim", job_id))
        return Claim(reviewer="rev1", claimed_at="2026-05-21T10:00:00Z", expires_at="2099-01-01T00:00:00Z")

    def release(self, job_id: str) -> bool:
        return True

    def download(self, url: str) -> bytes:
        self.calls.append(("download", url))
        if url == IMAGE.url:
            buf = io.BytesIO()
            Image.new("RGB", (W, H), (240, 240, 240)).save(buf, "PNG")
            return buf.getvalue()
        return self._png("RGBA" if "cutout" in url else "L")

    def preview(self, job_id: str, box_id: str, points: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append(("preview", (box_id, list(points))))
        if self.preview_error is not None:
            raise self.preview_error
        mask = base64.b64encode(self._png("L")).decode()
        return {
            "box_id": box_id,
            "mask_png_base64": mask,
            "area": 6400,
            "quality": {**FAIL, "verdict": "PASS"},
            "ms": 8,
        }

    def decide_masks(self, job_id: str, **kw: Any) -> InterventionResult:
        self.calls.append(("decide", kw))
        if self.refuse is not None:
            raise self.refuse
        return InterventionResult.model_validate(
            {
                "intervention_id": kw["intervention_id"],
                "job_id": job_id,
                "status": "PROCESSING_APPROVED_SUBJECTS",
                "version": self.snap.version + 1,
                "next_node_type": "PROCESS_APPROVED_BOX_LIST",
                "diff": {"kept": [], "added": [], "deleted": []},
            }
        )


def make(tmp_path: Path, snap: JobSnapshot) -> tuple[Components, ReviewerCallbacks, FakeClient, ReviewerState]:
    with gr.Blocks():
        comps = layout(token=None, require_login=False)
    cb = ReviewerCallbacks(comps, "http://127.0.0.1:9", ImageStore(tmp_path / "ui"))
    fake = FakeClient(snap)
    cb.clients.get = lambda token: fake  # type: ignore[method-assign,assignment,return-value]
    return comps, cb, fake, ReviewerState(token="t", signed_in=True)


def shown(update: Any) -> bool:
    if isinstance(update, str):  # a container's style element (ui.shown)
        return is_shown(update)
    return bool(update["visible"])


def test_opening_a_mask_review_claims_it_and_shows_the_first_failing_subject(tmp_path: Path) -> None:
    comps, cb, fake, st = make(tmp_path, mask_snapshot())
    m = comps.mask
    out = cb.open_job(st, "job_1")
    assert ("claim", "job_1") in fake.calls and st.reviewing and st.panel is None
    assert shown(out[m.col.style]) and not shown(out[comps.review_col.style]) and shown(out[comps.cancel_btn])
    assert "Check the cut-outs" in out[comps.stage_md] and "pause_m1" in out[comps.stage_md]
    assert "3 cut-outs wait for your decision" in out[comps.banner_md]
    assert "stops 24% of the box short" in out[m.subject_md] and "#1 shoe" in out[m.subject_md]
    assert out[m.subjects]["value"] == "box_1" and len(out[m.subjects]["choices"]) == 3
    assert Path(out[m.image]).name.startswith("pause_m1__box_1__") and Path(out[m.image]).exists()
    assert Path(out[m.cutout]).exists() and out[m.key].startswith("job_1|pause_m1|")
    assert not out[m.submit_btn]["interactive"] and "You are reviewing" in out[comps.claim_md]
    # The claim is renewed while the mask review is open (ui.claims), as for a box stage.
    st.renewed_at = 0.0
    cb.renew(st)
    assert [c for c in fake.calls if c[0] == "claim"] == [("claim", "job_1")] * 2


def test_accept_reject_refine_with_a_preview_then_one_submission(tmp_path: Path) -> None:
    comps, cb, fake, st = make(tmp_path, mask_snapshot())
    m = comps.mask
    cb.open_job(st, "job_1")
    out = cb.on_mask_accept(st)
    assert out[m.subjects]["value"] == "box_2" and "1 of 3 decided" in out[m.summary_md]
    assert json.loads(out[comps.draft_out])["draft"]["decisions"]["box_1"]["decision"] == "ACCEPT"
    out = cb.on_mask_reject(st, "")
    assert out[m.subjects]["value"] == "box_2" and "Reject needs a reason" in out[m.summary_md]
    cb.on_mask_reason(st, "the shoe is cut in half")
    out = cb.on_mask_reason_enter(st, "the shoe is cut in half")
    assert out[m.subjects]["value"] == "box_3"
    # A click before Refine adds nothing; after it, the click is a point and the preview is drawn.
    review = st.mask_review
    assert isinstance(review, MaskReview)
    name = Path(cb.subject_view(st, review)[m.image]).name
    click = json.dumps([{"x": 200, "y": 300, "positive": True, "src": f"/gradio_api/file=/tmp/x/{name}"}])
    assert "Press Refine (F) first" in cb.on_mask_points(st, click)[m.error_md]
    cb.on_mask_refine(st)
    out = cb.on_mask_points(st, click)
    assert out[m.error_md] == "" and ("preview", ("box_3", [review.decision().points[0].to_json()])) in fake.calls
    assert "Preview of your 1 point(s) (6400 px, 8 ms)" in out[m.subject_md] and "PASS" in out[m.subject_md]
    assert out[m.submit_btn]["interactive"]
    x, y = window_for(BOXES["box_3"], W, H).to_image(200, 300)
    assert review.decision().points == [Point(x, y, True)]
    stale = json.dumps([{"x": 5, "y": 5, "positive": False, "src": "/f/pause_m1__box_1__zz_view.png"}])
    cb.on_mask_points(st, stale)  # a click on another subject's picture: dropped
    assert len(review.decision().points) == 1
    out = cb.on_mask_submit(st)
    [(_, sent)] = [c for c in fake.calls if c[0] == "decide"]
    assert sent["pause_token"] == "pause_m1" and sent["base_version"] == 9 and sent["snapshot_id"]
    assert [d["decision"] for d in sent["decisions"]] == ["ACCEPT", "REJECT", "REFINE"]
    assert sent["decisions"][1]["reason"] == "the shoe is cut in half"
    assert "1 accepted, 1 rejected, 1 to refine" in out[comps.banner_md] and not shown(out[m.col.style])
    assert json.loads(out[comps.draft_out])["draft"] is None and st.mask_review is None
    assert st.snapshot is not None and st.snapshot.status == "PROCESSING_APPROVED_SUBJECTS"


def test_a_preview_that_is_refused_keeps_the_point(tmp_path: Path) -> None:
    comps, cb, fake, st = make(tmp_path, mask_snapshot())
    cb.open_job(st, "job_1")
    cb.on_mask_refine(st)
    review = st.mask_review
    assert isinstance(review, MaskReview)
    src = f"/f/{Path(cb.subject_view(st, review)[comps.mask.image]).name}"
    fake.preview_error = RateLimitedError(429, "RATE_LIMITED", "slow down")
    out = cb.on_mask_points(st, json.dumps([{"x": 100, "y": 100, "positive": True, "src": src}]))
    assert "Too many previews" in out[comps.mask.error_md] and len(review.decision().points) == 1
    assert "not here (yet)" in out[comps.mask.subject_md]


@pytest.mark.parametrize("code", ["VERSION_CONFLICT", "PAUSE_TOKEN_MISMATCH"])
def test_a_409_redraws_from_its_snapshot_and_keeps_what_still_applies(tmp_path: Path, code: str) -> None:
    comps, cb, fake, st = make(tmp_path, mask_snapshot())
    m = comps.mask
    cb.open_job(st, "job_1")
    cb.on_mask_accept(st)
    cb.on_mask_reject(st, "blurry")
    cb.on_mask_accept(st)
    newer = mask_snapshot([subject("box_1", mask="new.png"), subject("box_2")], token="pause_m2", version=11)
    fake.refuse = ConflictError(409, code, "stale", snapshot=newer.model_dump(mode="json"))
    out = cb.on_mask_submit(st)
    assert "out of date" in out[comps.banner_md] or "submitted first" in out[comps.banner_md]
    assert "#2 sock were kept" in out[comps.banner_md] and "Not kept" in out[comps.banner_md]
    assert "pause_m2" in out[comps.stage_md] and shown(out[m.col.style]) and len(out[m.subjects]["choices"]) == 2
    review = st.mask_review
    assert isinstance(review, MaskReview) and review.panel.pause_token == "pause_m2"
    assert review.decision("box_2").kind == "REJECT" and review.decision("box_1").kind is None
    first = [c for c in fake.calls if c[0] == "decide"][0][1]["intervention_id"]
    fake.refuse = None
    cb.on_mask_accept(st)
    cb.on_mask_submit(st)
    again = [c for c in fake.calls if c[0] == "decide"][-1][1]
    assert again["pause_token"] == "pause_m2" and again["intervention_id"] != first
    assert [d["box_id"] for d in again["decisions"]] == ["box_1", "box_2"]


def test_a_409_that_leaves_nothing_waiting_closes_the_panel(tmp_path: Path) -> None:
    comps, cb, fake, st = make(tmp_path, mask_snapshot())
    cb.open_job(st, "job_1")
    for _ in range(3):
        cb.on_mask_accept(st)
    done = mask_snapshot().model_copy(update={"status": JobStatus.SUCCEEDED, "active_pause": None, "version": 12})
    fake.refuse = ConflictError(409, "PAUSE_NOT_ACTIVE", "gone", snapshot=done.model_dump(mode="json"))
    fake.snap = done
    cb.store.results = lambda st, c: None  # type: ignore[method-assign,assignment,return-value]
    out = cb.on_mask_submit(st)
    assert "Another reviewer submitted first" in out[comps.banner_md] and "SUCCEEDED" in out[comps.banner_md]
    assert not shown(out[comps.mask.col.style]) and st.mask_review is None


def test_the_browser_draft_is_restored_once_for_a_fresh_review(tmp_path: Path) -> None:
    comps, cb, fake, st = make(tmp_path, mask_snapshot())
    cb.open_job(st, "job_1")
    review = st.mask_review
    assert isinstance(review, MaskReview)
    kept = MaskReview(review.panel)
    kept.decide("REJECT", "blurry")
    kept.go(2)
    kept.decide("ACCEPT")
    out = cb.on_mask_restore_draft(st, draft_message(kept, kept.panel))
    assert "restored from this browser" in out[comps.banner_md]
    now = st.mask_review
    assert (
        isinstance(now, MaskReview)
        and now.decision("box_1").kind == "REJECT"
        and now.decision("box_3").kind == "ACCEPT"
    )
    other = MaskReview(review.panel)
    other.decide("ACCEPT")
    assert comps.banner_md not in cb.on_mask_restore_draft(st, draft_message(other, other.panel))  # not twice


def test_another_reviewers_claim_turns_submit_off(tmp_path: Path) -> None:
    comps, cb, fake, st = make(tmp_path, mask_snapshot())
    cb.open_job(st, "job_1")
    for _ in range(3):
        cb.on_mask_accept(st)
    holder = Claim(reviewer="rev2", claimed_at="2026-05-21T10:00:00Z", expires_at="2099-01-01T00:00:00Z")
    st.held_by = holder
    out = cb.presence_update(st)
    assert not out[comps.mask.submit_btn]["interactive"] and shown(out[comps.takeover_btn])
    assert "rev2 has this job" in cb.on_mask_submit(st)[comps.mask.error_md]
    assert not [c for c in fake.calls if c[0] == "decide"]


def test_a_mask_review_opening_or_answered_elsewhere_is_drawn_live(tmp_path: Path) -> None:
    """The follower (ui.pump) applies newer snapshots: a mask review that opens after the box round shows
    up without a reload, and one another reviewer answers closes with a banner saying so."""
    comps, cb, fake, st = make(tmp_path, round1())
    cb.open_job(st, "job_1")
    assert st.panel is not None and st.mask_review is None
    st.results[st.panel.pause_token] = "Submitted"  # this reviewer's own box round
    st.panel = None
    update, _ = apply_and_render(st, mask_snapshot(version=9), cb)
    assert update is not None and shown(update[comps.mask.col.style]) and "pause_m1" in update[comps.stage_md]
    assert "3 cut-outs wait for your decision" in update[comps.banner_md]
    st.renewed_at = 0.0
    cb.renew(st)  # the new review is claimed like a new box round
    assert [c for c in fake.calls if c[0] == "claim"][-1] == ("claim", "job_1")
    moved_on = mask_snapshot(version=10).model_copy(
        update={"status": JobStatus.PROCESSING_APPROVED_SUBJECTS, "active_pause": None, "pending_actions": []}
    )
    update, _ = apply_and_render(st, moved_on, cb)
    assert update is not None and not shown(update[comps.mask.col.style]) and st.mask_review is None
    assert "Another reviewer submitted the decisions on these cut-outs first" in update[comps.banner_md]
