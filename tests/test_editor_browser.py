"""The box editor in a real browser: headless Debian Chromium driven by Playwright against ONE real
`hitl up` (embedded Redis, local Ray, Ray Serve, the Gradio UI) started with the label set
``shoe,bag,shirt`` (HITL_LABELS, which `hitl up` passes on to the UI process).

1. number keys label the selected box (a drawn one, a model one); Ctrl+Z / Ctrl+Shift+Z undo and
   redo; the submission carries the labels and the browser forgets its draft once it is confirmed;
2. a reload in the middle of an edit puts the unsent edits back (kept in localStorage under the job
   and pause), and a page load writes no asset lines to the server log;
3. "Reset to model boxes" brings the offered boxes back, and is itself undoable; Enter submits
   whatever button has focus;
4. every main control is reached with Tab, has an accessible name and a visible focus ring, in the
   light and the dark theme;
5. the queue shows thumbnails and stages in words, filters by stage, and its stats panel counts a
   decision made through the API.

The module prints its wall time. HITL_SCREENSHOTS=1 saves docs/screenshots/editor*.png.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.hitl_up import HitlUp
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.ui.panel import ROUND1_TEXT

from .browser_stack import page_maker, shared_ui_up
from .browser_util import (
    WAIT_MS,
    Api,
    Reviewer,
    contrast,
    screenshot,
)

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.slow]

SHARED_UI = "box-stages"  # one `hitl up` with the box list's and the keys' modules (tests/browser_stack.py)
GHOST = [430.0, 10.0, 620.0, 60.0]  # empty studio background above product_composite's objects
# Gradio's print per custom-component asset, and any access-log line for the page's own requests.
ASSET_LINE = re.compile(r"environment=client, type=component|file_name=|/gradio_api/|GET /assets/")


class Stack:
    def __init__(self, up: HitlUp) -> None:
        self.up = up
        self.ui_url = up.ui_url or ""
        self.api = Api(up.api_url, up.token)
        self.jobs: dict[str, str] = {}


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The box editor; the mask review has its own module (test_mask_review_browser).
    with shared_ui_up(request, tmp_path_factory, SHARED_UI) as up:
        s = Stack(up)
        try:
            jobs = (("keys", 21), ("reload", 22), ("reset", 23), ("focus", 24), ("decided", 25), ("enter", 26))
            for name, seed in jobs:
                s.jobs[name] = s.api.submit(product_composite(seed, 640, 480, n=2)[0])
            yield s
        finally:
            s.api.close()


@pytest.fixture
def reviewer(browser: Any, stack: Stack) -> Iterator[Callable[..., Reviewer]]:
    with page_maker(browser, stack.ui_url) as make:
        yield make


def open_review(rv: Reviewer, stack: Stack, name: str) -> tuple[str, dict[str, Any], tuple[int, int]]:
    job = stack.jobs[name]
    snap = stack.api.wait_round(job, 1)
    rv.open_url(job)
    rv.wait_panel(ROUND1_TEXT, snap["active_pause"]["pause_token"])
    return job, snap, (snap["image"]["width"], snap["image"]["height"])


def notes(rv: Reviewer, text: str, timeout: int = WAIT_MS) -> None:
    try:
        rv.expect_text("#box-notes", text, timeout=timeout)
    except AssertionError as e:  # say what the page said instead
        said = rv.page.inner_text("#review-error") + " | " + rv.page.inner_text("#banner")
        picked = rv.page.evaluate("JSON.stringify([window.__hitlSelected, window.__hitlPickN])")
        raise AssertionError(f"{e}\npage says: {said}\nselected, picks: {picked}") from None


@pytest.mark.timeout(240)
def test_number_keys_label_the_selected_box_and_undo_redo(stack: Stack, reviewer: Callable[..., Reviewer]) -> None:
    rv = reviewer()
    job, snap, size = open_review(rv, stack, "keys")
    token, boxes = snap["active_pause"]["pause_token"], snap["box_list"]
    rv.expect_text("#label-set", "1 · shoe")
    rv.expect_text("#label-set", "3 · shirt")

    rv.draw_box(GHOST, size)  # a freshly drawn box is the selected one
    notes(rv, "1 new box still needs a label")
    rv.page.keyboard.press("2")
    rv.expect_no_text("#box-notes", "needs a label")
    notes(rv, "drew 1 new")
    rv.wait_draft(job, token, lambda d: [a["label"] for a in d["added"]] == ["bag"], "the drawn box named bag")

    first = boxes[0]
    rv.select_box(first["bbox"], size)
    rv.page.keyboard.press("3")
    notes(rv, "relabelled 1, drew 1 new")
    screenshot(rv.page, "editor", full_page=True)

    rv.page.keyboard.press("Control+z")
    rv.expect_no_text("#box-notes", "relabelled")
    notes(rv, "drew 1 new")
    rv.page.keyboard.press("Control+z")  # the label of the drawn box
    notes(rv, "1 new box still needs a label")
    rv.page.keyboard.press("Control+Shift+z")  # twice at once: both count
    rv.page.keyboard.press("Control+Shift+z")
    notes(rv, "relabelled 1, drew 1 new")
    rv.wait_draft(job, token, lambda d: d["relabelled"] == {first["box_id"]: "shirt"}, "the redone relabel")

    rv.page.click("#submit-btn")
    # The drawn box lies on empty background, so the validator sends it back: the "Submitted" banner may
    # be replaced by the round-2 one before the browser is looked at (classical models take milliseconds).
    rv.expect_text("#banner", re.compile(r"Submitted|Your review was accepted"))
    after = stack.api.wait(job, lambda s: s["version"] > snap["version"], "the submission")
    manual = [b for b in after["box_list"] if b["source"] == "manual"]
    assert [b["label"] for b in manual] == ["bag"] and manual[0]["bbox"] == pytest.approx(GHOST, abs=3)
    assert {b["box_id"]: b["label"] for b in after["box_list"]}[first["box_id"]] == "shirt"
    rv.wait_no_draft(job, token, "its confirmed submission")  # confirmed: the browser forgets the draft
    stack.api.cancel(job)


FOCUS_BUTTON_JS = """(id) => {
  const el = document.getElementById(id);
  const b = el.tagName === "BUTTON" ? el : el.querySelector("button");
  b.focus();
  return document.activeElement === b;
}"""


@pytest.mark.timeout(240)
def test_enter_submits_whatever_button_has_focus(stack: Stack, reviewer: Callable[..., Reviewer]) -> None:
    """A clicked "Open next job (N)" keeps the focus; Enter, the documented submit key, used to press
    that button again (another job opened, the claim on this one released, nothing submitted). The
    keys act on the review panel wherever the focus is, except in a text field."""
    rv = reviewer()
    job, snap, _ = open_review(rv, stack, "enter")
    assert rv.page.evaluate(FOCUS_BUTTON_JS, "next-job-btn")
    rv.page.keyboard.press("Enter")
    rv.expect_text("#banner", re.compile(r"Submitted|The job ended"))
    after = stack.api.wait(job, lambda s: s["version"] > snap["version"], "the submission by Enter")
    assert {b["box_id"] for b in after["approved_box_list"]} == {b["box_id"] for b in snap["box_list"]}
    assert job in rv.page.inner_text("#job-id")  # the same job on screen: no other one was opened


@pytest.mark.timeout(240)
def test_a_reload_mid_edit_keeps_the_edits(stack: Stack, reviewer: Callable[..., Reviewer]) -> None:
    rv = reviewer()
    job, snap, size = open_review(rv, stack, "reload")
    token, boxes = snap["active_pause"]["pause_token"], snap["box_list"]
    rv.remove_box(boxes[-1]["bbox"], size)
    notes(rv, "deleted 1")  # each edit seen by the server before the next one starts
    rv.draw_box(GHOST, size)
    rv.page.keyboard.press("1")
    notes(rv, "deleted 1, drew 1 new")
    rv.expect_no_text("#box-notes", "needs a label")
    logged = len(stack.up.lines)

    rv.page.reload()
    rv.wait_panel(ROUND1_TEXT, token)
    rv.expect_text("#banner", "Restored your unsent edits")
    notes(rv, "deleted 1, drew 1 new")
    rv.expect_no_text("#box-notes", "needs a label")
    # The restored state is one step above the model's boxes. The key goes to the page once Undo is on
    # and nothing has focus: after a reload one rehearsal lost the key (Undo not yet on, or a field focused).
    rv.page.locator("#undo-btn:not([disabled]), #undo-btn button:not([disabled])").first.wait_for()
    rv.page.evaluate("document.activeElement && document.activeElement.blur()")
    rv.page.keyboard.press("Control+z")
    notes(rv, "No changes yet")
    rv.page.keyboard.press("Control+Shift+z")
    notes(rv, "deleted 1, drew 1 new")
    noisy = [ln for ln in stack.up.lines[logged:] if ASSET_LINE.search(ln)]
    assert not noisy, f"a page load wrote asset lines to the server log: {noisy[:3]}"
    assert stack.api.get(job)["version"] == snap["version"]  # nothing was sent
    stack.api.cancel(job)


@pytest.mark.timeout(240)
def test_reset_to_model_boxes(stack: Stack, reviewer: Callable[..., Reviewer]) -> None:
    rv = reviewer()
    job, snap, size = open_review(rv, stack, "reset")
    boxes = snap["box_list"]
    rv.remove_box(boxes[0]["bbox"], size)
    notes(rv, "deleted 1")
    rv.draw_box(GHOST, size)
    notes(rv, "deleted 1, drew 1 new")
    rv.page.click("#reset-btn")
    notes(rv, "No changes yet")
    rv.wait_no_draft(job, snap["active_pause"]["pause_token"], "the reset")
    rv.page.click("#undo-btn")
    notes(rv, "deleted 1, drew 1 new")
    stack.api.cancel(job)


MAIN_CONTROLS = ("next-job-btn", "submit-btn", "cut-nothing-btn", "undo-btn", "reset-btn", "label-btn-1")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_main_control_is_reached_by_tab_with_a_name_and_a_visible_focus(
    stack: Stack, reviewer: Callable[..., Reviewer], theme: str
) -> None:
    rv = reviewer(color_scheme=theme)
    job = stack.jobs["focus"]
    snap = stack.api.wait_round(job, 1)
    rv.page.goto(f"{rv.ui_url}/?job={job}&__theme={theme}")
    rv.wait_panel(ROUND1_TEXT, snap["active_pause"]["pause_token"])
    assert rv.page.evaluate("document.body.classList.contains('dark')") == (theme == "dark")
    rv.select_box(snap["box_list"][0]["bbox"], (snap["image"]["width"], snap["image"]["height"]))
    rv.page.keyboard.press("2")  # one edit, so that Undo is enabled (a disabled button takes no focus)
    rv.page.locator("#undo-btn:not([disabled]), #undo-btn button:not([disabled])").first.wait_for()
    rv.page.evaluate("document.activeElement && document.activeElement.blur()")
    if theme == "dark":
        rv.expect_text("#box-notes", "relabelled 1")
        screenshot(rv.page, "editor-dark", full_page=True)

    seen: dict[str, dict[str, Any]] = {}
    canvas: dict[str, Any] | None = None
    for _ in range(150):
        rv.page.keyboard.press("Tab")
        f = rv.focused()
        if f["id"] in MAIN_CONTROLS and f["id"] not in seen:
            seen[f["id"]] = f
        if f["id"] == "annotator" and f.get("tag") == "DIV":
            canvas = f
        if len(seen) == len(MAIN_CONTROLS) and canvas is not None:
            break
    missing = [c for c in MAIN_CONTROLS if c not in seen]
    assert not missing, f"not reached with Tab: {missing}"
    assert canvas is not None and "draws a box" in canvas["name"], canvas
    for f in [*seen.values(), canvas]:
        assert f["name"], f"no accessible name: {f}"
        assert f["outline"] != "none" and f["width"] >= 2, f"no visible focus: {f}"
        assert contrast(f["color"], f["bg"]) >= 3, f"focus ring hard to see (WCAG 1.4.11 asks 3:1): {f}"


@pytest.mark.timeout(240)
def test_queue_thumbnails_stage_words_filter_and_stats(stack: Stack, reviewer: Callable[..., Reviewer]) -> None:
    api, job = stack.api, stack.jobs["decided"]
    snap = api.wait_round(job, 1)
    pause = snap["active_pause"]
    body = {
        "intervention_id": "iv_editor_stats",
        "pause_token": pause["pause_token"],
        "base_version": pause["base_version"],
        "subjects": [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"]],
    }
    r = api.c.post(f"/api/v1/jobs/{job}/interventions", json=body)
    assert r.status_code == 200, r.text
    api.wait(job, lambda s: s["status"] in ("SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED"), "the end", timeout=120)

    waiting = stack.jobs["focus"]
    for other in stack.jobs.values():  # an earlier test that failed midway must not leave a job in round 2
        if other not in (job, waiting):
            stack.api.cancel(other)
    rv = reviewer()
    rv.open_queue()
    api.wait_round(waiting, 1)
    rv.queue_row(waiting).wait_for(state="visible")
    thumb = rv.page.locator(f'#queue-table img[alt="{waiting}"]').locator("visible=true").first
    thumb.wait_for(state="visible")
    assert rv.page.evaluate("(img) => img.naturalWidth", thumb.element_handle()) > 0, "the thumbnail did not load"
    rv.expect_text("#queue-table", "Confirm boxes (round 1)")
    assert "WAITING_" not in rv.page.inner_text("#queue-table")

    rv.page.locator("#stage-filter input").click()
    rv.page.get_by_role("option", name="Fix rejected boxes (round 2)").click()
    rv.expect_no_text("#queue-table", waiting)  # no job is in round 2
    rv.expect_text("#queue-note", "0 of")
    rv.page.locator("#stage-filter input").click()
    rv.page.get_by_role("option", name="All stages").click()
    rv.queue_row(waiting).wait_for(state="visible")

    rv.page.locator("#stats-panel").get_by_text("Review stats").click()
    rv.expect_text("#stats", "Median time to decision")
    rv.expect_text("#stats", re.compile(r"local\s+\d+\s+(\d+ min )?\d+ s"))  # the loopback token's name, count, median
