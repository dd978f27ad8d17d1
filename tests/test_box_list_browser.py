"""The interactive box list in a real browser: headless Debian Chromium driven by Playwright against ONE
real `hitl up` (embedded Redis, local Ray, Ray Serve, the Gradio UI). The images are 1280 px wide, so
the canvas shows them scaled down and every box travels in canvas units with a scale factor.

1. a click on a row selects that box in the canvas itself (Delete then removes that box); Tab and
   Shift+Tab on the image move the selection along the list, and past the last box Tab leaves the image;
2. ArrowRight/ArrowDown nudge the selected box by 1 image pixel, with Shift by 10: the submitted box
   moved by exactly that (its fractional model coordinates kept);
3. a nudge is an edit: Ctrl+Z takes it back, the draft is forgotten, and the submitted boxes are the
   model's to the last digit;
4. Hide and the score filter take boxes off the canvas (a click where a hidden box is does not reach
   it) and the page says they are still submitted; they are: as kept, unchanged;
5. a locked box is not moved by a drag or an arrow and not deleted by Delete; the page says why.

The module prints its wall time. HITL_SCREENSHOTS=1 saves docs/screenshots/box-list.png and full-size.png.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.hitl_up import HitlUp
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.ui.box_list import HIDDEN_RULE
from hitl_review.ui.panel import ROUND1_TEXT

from .browser_stack import page_maker, shared_ui_up
from .browser_util import (
    WAIT_MS,
    Api,
    Reviewer,
    screenshot,
)

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.slow]

SHARED_UI = "box-stages"  # one `hitl up` with the editor's and the keys' modules (tests/browser_stack.py)
SIZE = (1280, 960)
ZOOM_SIZE = (2000, 1500)  # the canvas shows it at 1280 × 960  # wider than the canvas: the annotator scales it down
SELECTED_TAG_JS = """() => {
  const b = window.hitlBoxList && window.hitlBoxList.selected();
  const m = b && /^#(\\d+)/.exec(b.label || "");
  return m ? Number(m[1]) : null;
}"""


class Stack:
    def __init__(self, up: HitlUp) -> None:
        self.up = up
        self.ui_url = up.ui_url or ""
        self.api = Api(up.api_url, up.token)
        self.jobs: dict[str, str] = {}


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with shared_ui_up(request, tmp_path_factory, SHARED_UI) as up:
        s = Stack(up)
        try:
            for name, seed in (("pick", 31), ("nudge", 32), ("undo", 33), ("hide", 34), ("lock", 35)):
                s.jobs[name] = s.api.submit(product_composite(seed, *SIZE, n=2)[0])
            s.jobs["zoom"] = s.api.submit(product_composite(36, *ZOOM_SIZE, n=2)[0])
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
    rv.page.locator("#box-list [data-row]").nth(len(snap["box_list"]) - 1).wait_for()
    scale = rv.page.evaluate("() => (window.hitlBoxList.boxes()[0] || {}).scaleFactor")
    assert scale is not None and scale < 1, f"the canvas shows the image unscaled ({scale})"
    return job, snap, (snap["image"]["width"], snap["image"]["height"])


def row(rv: Reviewer, tag: int, act: str = "pick") -> Any:
    return rv.page.locator(f'#box-list [data-tag="{tag}"] [data-act="{act}"]')


def expect_selected(rv: Reviewer, tag: int | None) -> None:
    try:
        rv.page.wait_for_function(f"(t) => ({SELECTED_TAG_JS})() === t", arg=tag, timeout=WAIT_MS // 4)
    except Exception:  # playwright's TimeoutError: say what is selected instead
        raise AssertionError(f"selected #{rv.page.evaluate(SELECTED_TAG_JS)}, expected #{tag}") from None


def focus_image(rv: Reviewer) -> None:
    rv.page.evaluate("document.querySelector('#annotator .annotator-container').focus()")


def submitted(stack: Stack, job: str, snap: dict[str, Any], rv: Reviewer) -> dict[str, list[float]]:
    """Submit from the page; the job's box list afterwards, by box id."""
    rv.page.click("#submit-btn")
    after = stack.api.wait(job, lambda s: s["version"] > snap["version"], "the submission")
    return {b["box_id"]: b["bbox"] for b in after["box_list"]}


@pytest.mark.timeout(240)
def test_a_row_click_selects_its_box_and_tab_walks_the_boxes(stack: Stack, reviewer: Callable[..., Reviewer]) -> None:
    rv = reviewer()
    job, snap, _ = open_review(rv, stack, "pick")
    boxes = snap["box_list"]
    n = len(boxes)
    assert n >= 2, f"product_composite gave {n} box(es)"
    row(rv, 2).click()
    expect_selected(rv, 2)
    rv.page.locator('#box-list [data-tag="2"].hbl-selected').wait_for()

    focus_image(rv)
    rv.page.keyboard.press("Shift+Tab")
    expect_selected(rv, 1)
    for tag in range(2, n + 1):
        rv.page.keyboard.press("Tab")
        expect_selected(rv, tag)
    rv.page.keyboard.press("Tab")  # past the last box: the focus leaves the image, the selection stays
    expect_selected(rv, n)
    assert not rv.page.evaluate("document.activeElement.classList.contains('annotator-container')")

    row(rv, 1).click()  # the canvas' own selection: its Delete removes this box
    expect_selected(rv, 1)
    rv.page.keyboard.press("Delete")
    rv.expect_text("#box-notes", "deleted 1")
    token = snap["active_pause"]["pause_token"]
    rv.wait_draft(job, token, lambda d: d["deleted"] == [boxes[0]["box_id"]], "the deleted box")
    stack.api.cancel(job)


@pytest.mark.timeout(240)
def test_arrows_nudge_the_selected_box_by_1_and_10_image_pixels(
    stack: Stack, reviewer: Callable[..., Reviewer]
) -> None:
    rv = reviewer()
    job, snap, (w, h) = open_review(rv, stack, "nudge")
    token, first = snap["active_pause"]["pause_token"], snap["box_list"][0]
    x1, y1, x2, y2 = first["bbox"]
    dx, key_x = (1, "ArrowRight") if x2 + 1 <= w else (-1, "ArrowLeft")
    dy, key_y = (10, "Shift+ArrowDown") if y2 + 10 <= h else (-10, "Shift+ArrowUp")
    want = [x1 + dx, y1 + dy, x2 + dx, y2 + dy]

    row(rv, 1).click()
    expect_selected(rv, 1)
    rv.page.keyboard.press(key_x)
    rv.expect_text("#box-notes", "moved 1")
    rv.expect_text('#box-list [data-tag="1"]', "moved")
    rv.page.keyboard.press(key_y)
    deadline = time.monotonic() + 30
    while True:  # the draft the browser keeps follows every edit
        kept = rv.draft(job, token)
        moved = kept["draft"]["moved"].get(first["box_id"]) if kept else None
        if moved == pytest.approx(want, abs=1e-6):
            break
        assert time.monotonic() < deadline, f"draft {kept}, want {want}"
        time.sleep(0.1)
    expect_selected(rv, 1)  # a nudge keeps the box selected
    after = submitted(stack, job, snap, rv)
    assert after[first["box_id"]] == pytest.approx(want, abs=1e-6)
    for b in snap["box_list"][1:]:
        assert after[b["box_id"]] == b["bbox"]  # the others exactly as the model gave them


@pytest.mark.timeout(240)
def test_undo_takes_a_nudge_back_and_the_model_boxes_go_out_unchanged(
    stack: Stack, reviewer: Callable[..., Reviewer]
) -> None:
    rv = reviewer()
    job, snap, _ = open_review(rv, stack, "undo")
    token = snap["active_pause"]["pause_token"]
    row(rv, 1).click()
    expect_selected(rv, 1)
    rv.page.keyboard.press("ArrowUp" if snap["box_list"][0]["bbox"][1] >= 1 else "ArrowDown")
    rv.expect_text("#box-notes", "moved 1")
    rv.page.locator("#undo-btn:not([disabled]), #undo-btn button:not([disabled])").first.wait_for()
    rv.page.keyboard.press("Control+z")
    rv.expect_text("#box-notes", "No changes yet")
    rv.expect_no_text('#box-list [data-tag="1"]', "moved")
    deadline = time.monotonic() + 10
    while rv.draft(job, token) is not None:
        assert time.monotonic() < deadline, "the draft outlived the undo of the only edit"
        time.sleep(0.1)
    after = submitted(stack, job, snap, rv)
    assert after == {b["box_id"]: b["bbox"] for b in snap["box_list"]}  # to the last digit


@pytest.mark.timeout(240)
def test_hidden_and_filtered_boxes_are_off_the_canvas_and_still_submitted(
    stack: Stack, reviewer: Callable[..., Reviewer]
) -> None:
    rv = reviewer()
    job, snap, size = open_review(rv, stack, "hide")
    boxes = snap["box_list"]
    row(rv, 1, "hide").click()
    rv.expect_text("#box-list .hbl-summary", "1 box hidden")
    rv.expect_text("#box-list .hbl-summary", HIDDEN_RULE)
    rv.page.locator('#box-list [data-tag="1"] [data-act="hide"][aria-pressed="true"]').wait_for()
    rv.page.wait_for_function("() => window.hitlBoxList.hidden(window.hitlBoxList.boxes()[0])")
    # a click where the hidden box is does not reach it
    rv.page.locator('#annotator button[aria-label="Drag boxes"]').click()
    bx = boxes[0]["bbox"]
    rv.page.mouse.click(*rv.point((bx[0] + bx[2]) / 2, (bx[1] + bx[3]) / 2, size))
    assert rv.page.evaluate(SELECTED_TAG_JS) != 1
    if len(boxes) > 1:
        row(rv, 2, "lock").click()
        rv.page.locator('#box-list [data-tag="2"] [data-act="lock"][aria-pressed="true"]').wait_for()
    screenshot(rv.page, "box-list", full_page=True)

    # the score filter above every score hides the rest; the page says they still go out
    field = rv.page.locator("#box-min-score input[type=number]")
    field.fill("1")
    field.press("Enter")
    n = len(boxes)
    rv.expect_text("#box-list .hbl-summary", f"{n} box{'es' if n > 1 else ''} hidden")
    rv.expect_text("#box-list .hbl-summary", "below the score filter")
    assert rv.page.evaluate("() => window.hitlBoxList.boxes().every((b) => window.hitlBoxList.hidden(b))")
    rv.page.evaluate("document.activeElement && document.activeElement.blur()")
    after = submitted(stack, job, snap, rv)
    assert after == {b["box_id"]: b["bbox"] for b in boxes}  # every hidden box kept, unchanged


@pytest.mark.timeout(240)
def test_a_locked_box_is_not_moved_nor_deleted(stack: Stack, reviewer: Callable[..., Reviewer]) -> None:
    rv = reviewer()
    job, snap, size = open_review(rv, stack, "lock")
    first = snap["box_list"][0]
    row(rv, 1, "lock").click()
    rv.page.locator('#box-list [data-tag="1"] [data-act="lock"][aria-pressed="true"]').wait_for()
    rv.expect_text('#box-list [data-tag="1"]', "locked")

    # a drag from its middle (drag mode) selects it but does not move it
    rv.page.locator('#annotator button[aria-label="Drag boxes"]').click()
    x1, y1, x2, y2 = first["bbox"]
    sx, sy = rv.point((x1 + x2) / 2, (y1 + y2) / 2, size)
    m = rv.page.mouse
    m.move(sx, sy)
    m.down()
    m.move(sx + 30, sy + 20, steps=5)
    m.move(sx + 60, sy + 40, steps=5)
    m.up()
    rv.expect_text("#box-list .hbl-status", "#1 is locked: unlock it in the list to move it")
    expect_selected(rv, 1)
    row(rv, 1).click()
    rv.page.keyboard.press("ArrowRight")
    rv.page.keyboard.press("Delete")
    rv.expect_text("#box-list .hbl-status", "#1 is locked: unlock it in the list to delete it")
    rv.expect_text("#box-notes", "No changes yet")
    after = submitted(stack, job, snap, rv)
    assert after == {b["box_id"]: b["bbox"] for b in snap["box_list"]}


def test_full_size_shows_the_original_at_its_own_pixels_and_escape_closes_it(
    stack: Stack, reviewer: Callable[..., Reviewer]
) -> None:
    rv = reviewer()
    job, snap, _ = open_review(rv, stack, "zoom")
    rv.page.locator("#zoom-btn").click()
    n = len(snap["box_list"])
    rv.expect_text("#zoom-note", f"Full size: 2000 × 1500 px (the canvas shows it at 1280 × 960); {n} box")
    img = rv.page.locator("#zoom-image img")
    img.wait_for(state="visible")
    rv.page.wait_for_function("(i) => i.complete && i.naturalWidth > 0", arg=img.element_handle())
    size = rv.page.evaluate(
        "(i) => [i.naturalWidth, i.naturalHeight, Math.round(i.getBoundingClientRect().width)]", img.element_handle()
    )
    assert size == [2000, 1500, 2000], f"natural size and width on the page: {size}"  # not fitted to the frame
    frame = rv.page.evaluate(
        "() => { const f = document.getElementById('zoom-image'); return [f.scrollWidth, f.clientWidth]; }"
    )
    assert frame[0] > frame[1], f"the frame does not scroll across: {frame}"
    rv.page.locator("#zoom-panel").scroll_into_view_if_needed()
    rv.page.evaluate(
        "() => { const f = document.getElementById('zoom-image'); f.scrollTo(f.scrollWidth / 3, f.scrollHeight / 3); }"
    )
    screenshot(rv.page, "full-size")
    rv.page.keyboard.press("Escape")
    rv.page.locator("#zoom-panel").wait_for(state="hidden")
    assert stack.api.get(job)["version"] == snap["version"], "looking at the full size changed the job"
