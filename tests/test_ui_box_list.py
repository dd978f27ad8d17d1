"""The interactive box list without a browser: its rows, hide/lock and the score filter, nudges read
back in image pixels at any canvas scale, and the rule that a box nobody touched stays exactly as the
model gave it. The browser half is tests/test_box_list_browser.py."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import gradio as gr
import pytest
from PIL import Image

from hitl_review.ui.annotator import edits_between, read_annotator, subjects_from_annotator
from hitl_review.ui.box_geometry import SAME_PLACE_TOL, translated_bbox
from hitl_review.ui.box_list import (
    HIDDEN_RULE,
    LOW_SCORE,
    BoxListState,
    box_rows,
    canvas_flags,
    hidden_note,
    render_list,
    state_for,
)
from hitl_review.ui.box_list_assets import BOX_LIST_JS, LIST_ON_LOAD_JS
from hitl_review.ui.box_list_view import BoxListView
from hitl_review.ui.callbacks import Callbacks
from hitl_review.ui.images import ImageStore
from hitl_review.ui.layout import Components, layout
from hitl_review.ui.panel import annotator_value, panel_from_snapshot
from hitl_review.ui.session import ReviewerState
from tests.ui_fakes import IMAGE, H, W, as_raw, drawn, model_box, opened, pause, round1, shown, snapshot

SCALE = 0.55  # the canvas shows the image at 55 %: every box is in these units, with its scaleFactor

FRACTIONAL = (100.37, 50.21, 200.88, 150.5)  # the classical detector gives boxes to 1/100 px


def fractional_panel() -> Any:
    snap = snapshot(boxes=[model_box(1, FRACTIONAL, "shoe", 0.92), model_box(2, (210, 40, 330, 200), "bag", 0.3)])
    snap = snap.model_copy(update={"active_pause": pause()})
    return shown(panel_from_snapshot(snap))


def nudged(raw: dict[str, Any], i: int, dx: float, dy: float) -> dict[str, Any]:
    """What the page's script does to box ``i`` for an arrow key: shift it by (dx, dy) image pixels in
    the box's own units (ui.box_list_assets ``nudge``)."""
    boxes = [dict(b) for b in raw["boxes"]]
    s = boxes[i]["scaleFactor"]
    boxes[i].update(
        xmin=boxes[i]["xmin"] + dx * s,
        xmax=boxes[i]["xmax"] + dx * s,
        ymin=boxes[i]["ymin"] + dy * s,
        ymax=boxes[i]["ymax"] + dy * s,
    )
    return {**raw, "boxes": boxes}


# --------------------------------------------------------------------------- geometry


def test_a_nudge_moves_the_box_by_whole_image_pixels_at_any_canvas_scale() -> None:
    panel = fractional_panel()
    raw = as_raw(annotator_value(panel, "/tmp/img.png"), SCALE)
    right = nudged(raw, 0, 1, 0)  # ArrowRight
    (first, _) = read_annotator(panel, right)
    assert first.bbox == pytest.approx((101.37, 50.21, 201.88, 150.5), abs=1e-9)  # exact size, no rounding
    down = nudged(right, 0, 0, 10)  # Shift+ArrowDown
    subjects, err = subjects_from_annotator(panel, down)
    assert err is None
    assert subjects[0]["bbox"] == pytest.approx([101.37, 60.21, 201.88, 160.5], abs=1e-9)
    assert subjects[1]["bbox"] == [210.0, 40.0, 330.0, 200.0]  # the other box untouched
    back = nudged(nudged(down, 0, -1, 0), 0, 0, -10)  # and back again: the model's exact box
    assert read_annotator(panel, back)[0].bbox == FRACTIONAL
    assert edits_between(panel, read_annotator(panel, back)).is_empty()


def test_an_untouched_box_stays_exactly_as_the_model_gave_it() -> None:
    panel = fractional_panel()
    raw = as_raw(annotator_value(panel, "/tmp/img.png"), SCALE)
    # float noise of the canvas' units (a resize of the page rescales every box), up to the tolerance
    for noise in (1e-9, 0.3, SAME_PLACE_TOL - 0.01):
        noisy = nudged(raw, 0, noise, -noise)
        assert read_annotator(panel, noisy)[0].bbox == FRACTIONAL
        subjects, _ = subjects_from_annotator(panel, noisy)
        assert subjects[0]["bbox"] == list(FRACTIONAL)
        assert edits_between(panel, read_annotator(panel, noisy)).is_empty()
    assert SAME_PLACE_TOL <= 0.5
    # a 1 px nudge is more than the tolerance: it counts
    assert list(edits_between(panel, read_annotator(panel, nudged(raw, 0, 1, 0))).moved) == ["box_1"]


def test_a_shift_keeps_the_box_inside_the_image_and_a_resize_is_rounded() -> None:
    assert translated_bbox((390.5, 10, 399.5, 20), (391.5, 10, 400.5, 20), W, H) == (391.0, 10.0, 400.0, 20.0)
    assert translated_bbox((0.5, 0.5, 10.5, 10.5), (-9.5, -9.5, 0.5, 0.5), W, H) == (0.0, 0.0, 10.0, 10.0)
    assert translated_bbox((10, 10, 20, 20), (11, 10, 22, 20), W, H) is None  # wider: not a plain shift
    panel = fractional_panel()
    raw = as_raw(annotator_value(panel, "/tmp/img.png"), SCALE)
    wider = dict(raw["boxes"][0], xmax=(FRACTIONAL[2] + 5) * SCALE)
    resized = read_annotator(panel, {**raw, "boxes": [wider, raw["boxes"][1]]})[0].bbox
    assert resized == (100.0, 50.0, 206.0, 150.0)  # a resize is rounded to whole pixels, as before


# --------------------------------------------------------------------------- rows, hide, lock, filter


def test_rows_follow_the_canvas_with_low_scores_marked() -> None:
    panel = shown(panel_from_snapshot(round1()))  # box_2 scores 0.55, box_3 0.41
    raw = as_raw(annotator_value(panel, "/tmp/img.png"), SCALE)
    raw["boxes"].insert(0, drawn(300, 200, 350, 260, label="new: hat", scale=SCALE))  # drawn by the reviewer
    del raw["boxes"][1]  # box_1 deleted: no row
    rows = box_rows(panel, read_annotator(panel, raw), {"box_2": "boot"})
    assert [r.name for r in rows] == ["#2", "#3", "new box 1"]
    assert [r.title for r in rows] == ["#2 boot", "#3 hand", "new box 1 hat"]
    assert [r.low for r in rows] == [False, True, False] and LOW_SCORE == 0.5
    assert rows[0].relabelled and not rows[0].moved and rows[2].source == "drawn"
    assert canvas_flags(panel, rows) == {
        "key": "job_1|pause_1",
        "w": W,
        "h": H,
        "hidden": [],
        "locked": [],
        "low": [3],
    }


def test_hide_lock_and_the_score_filter() -> None:
    panel = shown(panel_from_snapshot(round1()))
    value = as_raw(annotator_value(panel, "/tmp/img.png"))
    drawn_now = read_annotator(panel, value)
    st = BoxListState("pause_1")
    assert st.toggle("hide", "box_1", 0.92, 0.0) and st.toggle("lock", "box_2", 0.55, 0.0)
    rows = box_rows(panel, drawn_now, state=st, min_score=0.0)
    assert [(r.hidden, r.locked) for r in rows] == [(True, False), (False, True), (False, False)]
    assert hidden_note(rows) == f"1 box hidden. {HIDDEN_RULE}"

    # the slider at 0.5 hides box_3 (0.41) too; the hand-drawn box of a later round has no score
    rows = box_rows(panel, drawn_now, state=st, min_score=0.5)
    assert [r.hidden for r in rows] == [True, False, True] and rows[2].below
    assert canvas_flags(panel, rows)["hidden"] == [1, 3]
    assert hidden_note(rows).startswith("2 boxes hidden (1 below the score filter).")
    # "Show" on a box below the filter shows it; "Hide" hides it again
    st.toggle("hide", "box_3", 0.41, 0.5)
    assert not st.is_hidden("box_3", 0.41, 0.5)
    st.toggle("hide", "box_3", 0.41, 0.5)
    assert st.is_hidden("box_3", 0.41, 0.5)
    # unhide and unlock
    st.toggle("hide", "box_1", 0.92, 0.5)
    st.toggle("lock", "box_2", 0.55, 0.5)
    assert not st.is_hidden("box_1", 0.92, 0.5) and st.locked == set()
    assert not st.toggle("delete", "box_1", 0.92, 0.5)  # not an act of the list
    # a new pause starts with nothing hidden or locked
    st.toggle("lock", "box_1", 0.92, 0.0)
    assert state_for(st, "pause_1") is st and state_for(st, "pause_2").locked == set()


def test_hidden_boxes_are_still_submitted_as_kept() -> None:
    panel = shown(panel_from_snapshot(round1()))
    raw = as_raw(annotator_value(panel, "/tmp/img.png"), SCALE)
    st = BoxListState("pause_1", hidden={"box_1"})
    rows = box_rows(panel, read_annotator(panel, raw), state=st, min_score=0.6)
    assert [r.hidden for r in rows] == [True, True, True]
    subjects, err = subjects_from_annotator(panel, raw)  # hiding changes nothing in the value
    assert err is None and [s["box_id"] for s in subjects] == ["box_1", "box_2", "box_3"]


def test_the_list_html_carries_the_flags_escapes_labels_and_says_hidden_boxes_are_kept() -> None:
    panel = shown(panel_from_snapshot(round1()))
    raw = as_raw(annotator_value(panel, "/tmp/img.png"))
    raw["boxes"].insert(0, drawn(300, 200, 350, 260, label='new: <img src=x onerror="alert(1)">'))
    st = BoxListState("pause_1", hidden={"box_2"}, locked={"box_1"})
    text = render_list(panel, box_rows(panel, read_annotator(panel, raw), state=st))
    flags = json.loads(html.unescape(re.search(r'data-flags="([^"]*)"', text).group(1)))  # type: ignore[union-attr]
    assert flags["hidden"] == [2] and flags["locked"] == [1] and flags["low"] == [3]
    assert "<img" not in text and "&lt;img" in text
    assert HIDDEN_RULE in html.unescape(text)
    assert 'data-act="hide" aria-pressed="true" aria-label="Show #2 sock"' in text
    assert 'data-act="lock" aria-pressed="true" aria-label="Unlock #1 shoe"' in text
    assert 'aria-label="Select #3 hand on the image"' in text
    assert text.count('data-act="hide"') == 3  # the drawn box has no Hide or Lock
    assert 'data-new="1"' in text and "needs a label" not in text
    assert render_list(None, []) == ""


def test_the_scripts_know_the_canvas_and_the_list() -> None:
    assert "%CSS%" not in BOX_LIST_JS and "#box-list .hbl-row" in BOX_LIST_JS
    for name in ("creatingAnchorX", "isPointInsideBox", "startDrag", "startResize", "Remove box", "Drag boxes"):
        assert name in BOX_LIST_JS
    assert 'trigger("click"' in LIST_ON_LOAD_JS and "hitlBoxList.pick" in LIST_ON_LOAD_JS


# --------------------------------------------------------------------------- handlers without a server


class Event:
    """What gr.HTML's ``trigger("click", data)`` hands the handler."""

    def __init__(self, **data: Any) -> None:
        self._data = data


def handlers(tmp_path: Path) -> tuple[Components, Callbacks, BoxListView, ReviewerState]:
    with gr.Blocks():
        comps = layout(token=None, require_login=False, labels=("shoe",))
    cb = Callbacks(comps, "http://127.0.0.1:9", ImageStore(tmp_path / "ui"), ("shoe",))
    cb.store.image_dir.mkdir(parents=True)
    Image.new("RGB", (W, H), (250, 250, 250)).save(cb.store.image_dir / f"{IMAGE.sha256}.png")
    st = opened(round1())
    cb.store.ensure(st, cb.clients.get(st.token))
    return comps, cb, BoxListView(comps), st


def test_the_list_follows_the_canvas_and_hide_lock_go_through_the_app(tmp_path: Path) -> None:
    comps, cb, view, st = handlers(tmp_path)
    out = cb.view(st, redraw=True)
    raw = as_raw(out[comps.annotator], SCALE)
    html_out = view.on_canvas(st, raw, 0.0)[comps.box_list.html]
    assert html_out.count('data-row="1"') == 3 and "Click a box to select it" in html_out

    html_out = view.on_act(st, raw, 0.0, Event(act="hide", box_id="box_1"))[comps.box_list.html]  # type: ignore[arg-type]
    assert "1 box hidden" in html_out and st.box_list.hidden == {"box_1"}
    view.on_act(st, raw, 0.0, Event(act="lock", box_id="box_2"))  # type: ignore[arg-type]
    assert st.box_list.locked == {"box_2"}
    # an unknown box or act changes nothing
    assert view.on_act(st, raw, 0.0, Event(act="hide", box_id="box_9"))[comps.box_list.html] == gr.skip()  # type: ignore[arg-type]
    # the slider hides box_3 (0.41) as well; the canvas' value is untouched, so all three are submitted
    html_out = view.on_canvas(st, raw, 0.45)[comps.box_list.html]
    assert "2 boxes hidden (1 below the score filter)" in html_out
    subjects, err = subjects_from_annotator(st.panel, raw)
    assert err is None and len(subjects) == 3

    # a nudge reaches the app as an edit of the canvas: recorded for undo and kept as a draft
    moved = nudged(raw, 0, 1, 0)
    out = cb.on_annotator_change(st, moved, None)
    assert "moved 1" in out[comps.notes_md] and out[comps.undo_btn]["interactive"] is True
    assert json.loads(out[comps.draft_out])["draft"]["moved"] == {"box_1": [11.0, 20.0, 111.0, 120.0]}
    assert "moved" in view.on_canvas(st, moved, 0.45)[comps.box_list.html]
    out = cb.on_undo(st, moved)
    assert out[comps.annotator]["boxes"][0]["xmin"] == 10.0 and json.loads(out[comps.draft_out])["draft"] is None

    # the next round starts with nothing hidden or locked
    st.open(snapshot(boxes=[model_box(1)], active=pause("pause_2", round_=1)))
    out = cb.view(st, redraw=True)
    html_out = view.on_canvas(st, as_raw(out[comps.annotator]), 0.0)[comps.box_list.html]
    assert "hidden" not in html_out.split("data-flags")[0] and st.box_list.pause_token == "pause_2"
    assert st.box_list.hidden == set() and st.box_list.locked == set()


def test_no_review_no_list(tmp_path: Path) -> None:
    _, _, view, _ = handlers(tmp_path)
    st = ReviewerState(token="t", signed_in=True)
    out = view.on_canvas(st, None, 0.0)
    assert list(out.values()) == [""]
