"""The mask-review panel in a real browser: headless Debian Chromium driven by Playwright against ONE
real `hitl up --quality-gate review-failing` (embedded Redis, local Ray, Ray Serve, the Gradio UI,
the classical models).

A product photograph with three subjects; the boxes are confirmed through the API, each widened far
past its subject so that GrabCut's masks stop short of the boxes and the quality gate still fails
them after their refinements: the job waits in WAITING_MASK_REVIEW with three failing subjects. On
the page the reviewer sees the first one with the gate's reasons, refines it with three points (a
click, a Shift-click and a right-click: one positive, two negative), each previewed, reloads the page
and finds them kept by the browser, accepts the second with A, rejects the third with a reason,
submits, and the job ends PARTIAL_SUCCEEDED: the refined subject is cut out as the reviewer decided,
the accepted one too, the rejected one carries the reviewer's reason.

HITL_SCREENSHOTS=1 saves docs/screenshots/mask-review-failing.png and mask-review-refine.png.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from harness.hitl_up import HitlUp
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.ui.mask_render import window_for
from hitl_review.ui.mask_review import MASK_STAGE, MASK_STAGE_TEXT

from .browser_stack import ui_up
from .browser_util import (
    VIEWPORT,
    WAIT_MS,
    Api,
    Reviewer,
    screenshot,
)

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.slow]

WIDTH, HEIGHT = 720, 480
WIDEN = (40.0, 50.0)  # px added on each side of a detected box: the mask then stops far short of it


class Stack:
    def __init__(self, up: HitlUp) -> None:
        self.up = up
        self.ui_url = up.ui_url or ""
        self.api = Api(up.api_url, up.token)


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # --quality-gate review-failing, the default: the cut-outs the gate fails wait for a person
    with ui_up(request, tmp_path_factory.mktemp("hitl-mask-review")) as up:
        s = Stack(up)
        try:
            yield s
        finally:
            s.api.close()


def widened(bbox: list[float]) -> list[float]:
    x1, y1, x2, y2 = bbox
    dx, dy = WIDEN
    return [max(0.0, x1 - dx), max(0.0, y1 - dy), min(float(WIDTH), x2 + dx), min(float(HEIGHT), y2 + dy)]


def job_in_mask_review(api: Api) -> tuple[str, dict[str, Any]]:
    """A job whose three subjects the gate still fails, waiting for a person."""
    job = api.submit(product_composite(31, WIDTH, HEIGHT, n=3)[0])
    snap = api.wait_round(job, 1, timeout=120)
    subjects = [{"box_id": b["box_id"], "bbox": widened(b["bbox"])} for b in snap["box_list"]]
    body = {
        "intervention_id": f"iv_mask_{job}",
        "pause_token": snap["active_pause"]["pause_token"],
        "base_version": snap["version"],
        "subjects": subjects,
    }
    r = api.c.post(f"/api/v1/jobs/{job}/interventions", json=body)
    assert r.status_code == 200, r.text
    waiting = api.wait(
        job,
        lambda s: bool(s["active_pause"]) and s["active_pause"]["stage"] == MASK_STAGE,
        "mask review",
        timeout=180,
    )
    return job, waiting


def click_on_subject(
    rv: Reviewer, bbox: list[float], x: float, y: float, *, shift: bool = False, button: str = "left"
) -> None:
    """Click the image pixel (x, y) on the mask panel's picture of the subject in ``bbox`` (Shift held: ``shift``)."""
    img = rv.page.locator("#mask-image img")
    img.wait_for(state="visible", timeout=WAIT_MS)
    box = img.bounding_box()
    natural = rv.page.evaluate(
        "() => { const i = document.querySelector('#mask-image img'); return [i.naturalWidth, i.naturalHeight]; }"
    )
    assert box and natural[0] > 0, "the picture has no size"
    win = window_for(bbox, WIDTH, HEIGHT)
    vx, vy = win.to_view(x, y)
    s = min(box["width"] / natural[0], box["height"] / natural[1], 1)
    ox, oy = (box["width"] - natural[0] * s) / 2, (box["height"] - natural[1] * s) / 2
    if shift:
        rv.page.keyboard.down("Shift")
    try:
        rv.page.mouse.click(box["x"] + ox + vx * s, box["y"] + oy + vy * s, button=button)
    finally:
        if shift:
            rv.page.keyboard.up("Shift")


def subject_line(rv: Reviewer, text: str | re.Pattern[str], timeout: int = WAIT_MS) -> None:
    try:
        rv.expect_text("#mask-subject", text, timeout=timeout)
    except AssertionError as e:  # say what the page said instead
        said = {sel: rv.page.inner_text(sel) for sel in ("#mask-error", "#banner", "#mask-summary")}
        raise AssertionError(f"{e}\npage says: {said}") from None


@pytest.mark.timeout(420)
def test_a_reviewer_refines_accepts_and_rejects_the_cut_outs_the_gate_failed(stack: Stack, browser: Any) -> None:
    job, snap = job_in_mask_review(stack.api)
    listed = snap["active_pause"]["subjects_to_review"]
    assert len(listed) == 3, [s["quality"] for s in listed]
    assert all(s["quality"]["verdict"] == "FAIL" and s["quality"]["reasons"] for s in listed), listed
    first, second, third = listed

    ctx = browser.new_context(viewport=VIEWPORT)
    ctx.set_default_timeout(WAIT_MS)
    try:
        rv = Reviewer(ctx.new_page(), stack.ui_url)
        rv.open_queue()  # the queue names the stage in words; a click on the row opens the job
        rv.expect_text("#queue-table", "Review cut-outs")
        rv.open_from_queue(job)
        rv.page.locator("#mask-review-panel").wait_for(state="visible", timeout=WAIT_MS)
        rv.expect_text("#stage-text", MASK_STAGE_TEXT)
        rv.expect_text("#stage-text", snap["active_pause"]["pause_token"])
        rv.expect_text("#claim-note", "You are reviewing")
        subject_line(rv, "#1")
        subject_line(rv, first["quality"]["reasons"][0][:40])
        rv.expect_text("#mask-summary", "0 of 3 decided")
        rv.page.locator("#mask-image img").wait_for(state="visible", timeout=WAIT_MS)
        screenshot(rv.page, "mask-review-failing", full_page=True)

        # Refine the first: F, then a click on the subject, a Shift-click and a right-click beside it.
        rv.page.keyboard.press("f")
        subject_line(rv, "Click the image to add points")
        x1, y1, x2, y2 = first["bbox"]
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        click_on_subject(rv, first["bbox"], cx, cy)
        subject_line(rv, "Preview of your 1 point(s)")
        click_on_subject(rv, first["bbox"], x1 + 8, y1 + 8, shift=True)
        subject_line(rv, "Preview of your 2 point(s)")
        click_on_subject(rv, first["bbox"], x2 - 8, y2 - 8, button="right")
        subject_line(rv, "Preview of your 3 point(s)")
        rv.expect_text("#mask-subjects", "Refine: 3 points")
        screenshot(rv.page, "mask-review-refine", full_page=True)
        draft = rv.page.evaluate(
            "(k) => JSON.parse(localStorage.getItem(k) || 'null')",
            f"hitl-draft:mask:{job}:{snap['active_pause']['pause_token']}",
        )
        assert draft is not None, "the browser keeps the unsent decisions"
        points = draft["draft"]["decisions"][first["box_id"]]["points"]
        assert [p["positive"] for p in points] == [True, False, False], points
        assert points[0]["x"] == pytest.approx(cx, abs=3) and points[0]["y"] == pytest.approx(cy, abs=3)

        # A reload (the address carries ?job=) reopens the review with the decisions this browser kept.
        rv.page.reload()
        rv.expect_text("#job-id", job)
        rv.expect_text("#mask-subjects", "Refine: 3 points")
        rv.expect_text("#banner", "restored from this browser")
        subject_line(rv, "Preview of your 3 point(s)")

        # N: the second subject; A accepts it and moves on to the third; R, a reason and Enter reject it.
        rv.page.keyboard.press("n")
        subject_line(rv, "#2")
        rv.page.keyboard.press("a")
        subject_line(rv, "#3")
        rv.expect_text("#mask-summary", "2 of 3 decided")
        rv.page.keyboard.press("r")
        reason = rv.page.locator("#mask-reason input, #mask-reason textarea").first
        reason.fill("the product is cut off at the bottom")
        reason.press("Enter")
        rv.expect_text("#mask-summary", "3 of 3 decided")
        rv.expect_text("#mask-subjects", "cut off at the bottom")

        submit = rv.page.locator("#mask-submit-btn")
        from playwright.sync_api import expect

        expect(submit).to_be_enabled(timeout=WAIT_MS)
        submit.click()
        rv.expect_text("#banner", re.compile(r"Decisions submitted|The job ended"))
        rv.expect_text("#job-status", "PARTIAL_SUCCEEDED", timeout=180_000)
        rv.page.locator("#results-panel").wait_for(state="visible", timeout=WAIT_MS)
        assert not rv.page.locator("#mask-review-panel").is_visible()
    finally:
        ctx.close()

    res = stack.api.results(job)
    by_id = {s["box_id"]: s for s in res["subjects"]}
    assert res["status"] == "PARTIAL_SUCCEEDED"
    assert by_id[first["box_id"]]["status"] == "SUCCEEDED" and by_id[first["box_id"]]["decided_by"] not in (
        None,
        "gate",
    )
    assert by_id[second["box_id"]]["status"] == "SUCCEEDED" and by_id[second["box_id"]]["decided_by"] not in (
        None,
        "gate",
    )
    assert by_id[third["box_id"]]["status"] == "REJECTED"
    assert "cut off at the bottom" in (by_id[third["box_id"]]["reason"] or "")


MASK_BUTTONS = (  # every button of the mask-review panel a reviewer clicks (focus stays on it)
    "mask-next-btn",
    "mask-prev-btn",
    "mask-refine-btn",
    "mask-undo-point-btn",
    "mask-clear-points-btn",
    "mask-reject-btn",
    "mask-accept-btn",
)


def subject_no(rv: Reviewer) -> int:
    m = re.search(r"#(\d+)", rv.page.inner_text("#mask-subject"))
    return int(m.group(1)) if m else 0


def settled_subject(rv: Reviewer) -> int:
    """The subject shown once the panel stopped changing (a click's answer arrived)."""
    import time

    last, since = subject_no(rv), time.monotonic()
    while time.monotonic() - since < 1.0:
        time.sleep(0.1)
        now = subject_no(rv)
        if now != last:
            last, since = now, time.monotonic()
    return last


@pytest.mark.timeout(420)
def test_the_mask_panels_keys_act_whatever_button_has_focus(stack: Stack, browser: Any) -> None:
    """N and Shift+N move between subjects after a click on each of the panel's buttons (issue 22: the
    documented keys act on the panel whatever button has focus, except while typing)."""
    job, snap = job_in_mask_review(stack.api)
    n = len(snap["active_pause"]["subjects_to_review"])
    assert n >= 2
    ctx = browser.new_context(viewport=VIEWPORT)
    ctx.set_default_timeout(WAIT_MS)
    try:
        rv = Reviewer(ctx.new_page(), stack.ui_url)
        rv.open_url(job)
        rv.page.locator("#mask-review-panel").wait_for(state="visible", timeout=WAIT_MS)
        subject_line(rv, "#1")
        for button in MASK_BUTTONS:
            for key, step in (("n", 1), ("Shift+N", -1)):
                rv.page.locator(f"#{button}").click()
                before = settled_subject(rv)
                focused = rv.page.evaluate("() => document.activeElement && document.activeElement.id")
                rv.page.keyboard.press(key)
                want = (before - 1 + step) % n + 1
                try:
                    subject_line(rv, f"#{want}")
                except AssertionError as e:
                    raise AssertionError(f"{key} after a click on {button} (focus: {focused!r}): {e}") from None
    finally:
        ctx.close()
    assert stack.api.get(job)["status"] == MASK_STAGE  # moving between subjects decided nothing
