"""The reviewer page's keys whatever button has focus: headless Debian Chromium driven by Playwright
against ONE real `hitl up` (embedded Redis, local Ray, Ray Serve, the Gradio UI) with the label set
``shoe,bag,shirt``.

A clicked button keeps the focus, and Enter or Space on a focused button presses it again: a clicked
"Open next job" once took Enter to itself (another job opened, nothing submitted). The page's
documented keys act on the review panel wherever the focus is, except in a text field
(ui.assets.KEYS_JS). For each visible button of the box-review panel (Open next job, Submit, Undo,
Redo, Reset, a label button, Skip, Flag, Add comment, and the first buttons of Cut nothing and Cancel,
not the confirmations' own), the test clicks it, then presses each key and checks what the key says
it does on the review panel:

- Enter submits the boxes of the job on screen (never a cut-nothing, a cancel, or another job);
- N opens another job and leaves the one it left waiting; S skips the job on screen, then opens another;
- a digit gives the selected box that label; Ctrl+Z undoes the last box edit.

Submit is focused rather than clicked (a click would submit). A click on "Open next job" or "Skip"
opens another job first: the key then acts on that one (for Ctrl+Z, the edits this browser kept for
it are restored first, so there is an edit to undo; for a digit no box is selected there, and the page
says so instead of pressing the focused button). One page and one job per key where the key leaves
the job on screen (digits, Ctrl+Z); N, S and Enter each move on to the next job. The module prints its
wall time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from harness.hitl_up import HitlUp
from hitl_review.client import HitlClient
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.ui.annotator import Edits
from hitl_review.ui.editor import draft_key, edits_to_json
from hitl_review.ui.panel import ROUND1_TEXT

from .browser_stack import SHARED_STACKS, shared_ui_up
from .browser_util import VIEWPORT, WAIT_MS, Api, Reviewer

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.slow]

SHARED_UI = "box-stages"  # one `hitl up` with the box list's and the editor's modules (tests/browser_stack.py)
LABELS = tuple(SHARED_STACKS[SHARED_UI][1]["HITL_LABELS"].split(","))
BUTTONS = (
    "next-job-btn",
    "submit-btn",
    "undo-btn",
    "redo-btn",
    "reset-btn",
    "label-btn-1",
    "skip-btn",
    "flag-btn",
    "comment-btn",
    "cut-nothing-btn",
    "cancel-job-btn",
)
MOVES = ("next-job-btn", "skip-btn")  # their click opens another job
POOL = 36  # waiting jobs: S skips one per button, Enter submits one per button, N needs two more
JOB_ID = re.compile(r"job_\w+")
NO_SELECTION = "Select a box first"
FOCUS_BUTTON_JS = """(id) => {
  const el = document.getElementById(id);
  const b = el.tagName === "BUTTON" ? el : el.querySelector("button");
  b.focus();
  return document.activeElement === b;
}"""


class Stack:
    def __init__(self, up: HitlUp) -> None:
        self.up = up
        self.ui_url = up.ui_url or ""
        self.api = Api(up.api_url, up.token)

    def next_job(self, exclude: list[str]) -> str | None:
        """The job "Open next job" gives the page's reviewer (the local token's identity) now."""
        with HitlClient(self.up.api_url, self.up.token) as me:
            found = me.next_job(exclude=exclude)
        return found.job_id if found is not None else None


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with shared_ui_up(request, tmp_path_factory, SHARED_UI) as up:
        s = Stack(up)
        try:
            jobs = [s.api.submit(product_composite(100 + i, 640, 480, n=2)[0]) for i in range(POOL)]
            for job in jobs:
                s.api.wait_round(job, 1)
            yield s
        finally:
            s.api.close()


@pytest.fixture
def page(browser: Any, stack: Stack) -> Iterator[Panel]:
    """A reviewer page at the next waiting job, settled."""
    ctx = browser.new_context(viewport=VIEWPORT)
    ctx.set_default_timeout(WAIT_MS)
    try:
        p = Panel(Reviewer(ctx.new_page(), stack.ui_url), stack)
        job = stack.next_job([])
        assert job is not None, "no waiting job left for this test"
        p.rv.open_url(job)
        p.settle()
        yield p
    finally:
        ctx.close()


class Panel:
    """The job on the page and the moves made on it; ``cur`` is the label the page gave its first box."""

    def __init__(self, rv: Reviewer, stack: Stack) -> None:
        self.rv, self.stack, self.api = rv, stack, stack.api
        self.snap: dict[str, Any] = {}
        self.cur: str | None = None

    @property
    def job(self) -> str:
        return str(self.snap["job_id"])

    @property
    def token(self) -> str:
        return str(self.snap["active_pause"]["pause_token"])

    @property
    def box(self) -> dict[str, Any]:
        return dict(self.snap["box_list"][0])

    def shown(self) -> str:
        m = JOB_ID.search(self.rv.page.inner_text("#job-id"))
        return m.group(0) if m else ""

    def settle(self, before: str | None = None) -> None:
        """The job on screen (another one than ``before``) drawn, claimed, and known to the test."""
        if before is not None:
            self.wait(lambda: self.shown() not in ("", before), f"another job than {before}")
        snap = self.api.get(self.shown())
        assert snap["active_pause"] and snap["status"] == "WAITING_USER_SELECTION", (snap["job_id"], snap["status"])
        self.rv.wait_panel(ROUND1_TEXT, snap["active_pause"]["pause_token"])
        self.rv.expect_text("#claim-note", "You are reviewing this job")
        self.snap = snap
        self.cur = self.label()

    def wait(self, ok: Callable[[], bool], what: str, timeout: float = WAIT_MS / 1000) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            assert time.monotonic() < deadline, f"no {what}; the page: {self.rv.shown()}"
            time.sleep(0.1)

    # -- the first box's label, as the browser keeps the review's unsent edits

    def label(self) -> str | None:
        kept = self.rv.draft(self.job, self.token)
        return (kept or {}).get("draft", {}).get("relabelled", {}).get(self.box["box_id"])

    def labels(self) -> list[str]:
        """The labels the page gave any box of the job on screen."""
        kept = self.rv.draft(self.job, self.token)
        return list((kept or {}).get("draft", {}).get("relabelled", {}).values())

    def wait_label(self, want: str | None, why: str) -> None:
        self.wait(lambda: self.label() == want, f"label {want!r} on the first box ({why}; it has {self.label()!r})")
        self.cur = want

    def fresh_digit(self, *avoid: str | None) -> int:
        return next(d for d in (1, 2, 3) if LABELS[d - 1] not in (self.cur, *avoid))

    def select(self) -> None:
        self.rv.select_box(self.box["bbox"], (self.snap["image"]["width"], self.snap["image"]["height"]))

    def relabel(self, *avoid: str | None) -> None:
        """An edit: select the first box and press a number key (the focus ends on the canvas)."""
        self.select()
        d = self.fresh_digit(*avoid)
        self.rv.page.keyboard.press(str(d))
        self.wait_label(LABELS[d - 1], f"key {d} on the selected box")

    def plant_draft(self, job: str, label: str) -> None:
        """Unsent edits this browser keeps for ``job``: restored (and undoable) when the job opens."""
        snap = self.api.get(job)
        token, box = snap["active_pause"]["pause_token"], snap["box_list"][0]["box_id"]
        kept = {"job_id": job, "pause_token": token, "draft": edits_to_json(Edits(relabelled={box: label}))}
        kept["saved_at"] = int(time.time() * 1000)
        self.rv.page.evaluate("([k, v]) => localStorage.setItem(k, v)", [draft_key(job, token), json.dumps(kept)])

    # -- a button clicked as a reviewer clicks it (Submit: focused)

    def click(self, button: str) -> None:
        page, before = self.rv.page, self.job
        if button == "submit-btn":
            assert page.evaluate(FOCUS_BUTTON_JS, button)
            return
        page.locator(f"#{button}").click()
        if button in MOVES:
            self.settle(before)
        elif button == "cut-nothing-btn":
            page.locator("#confirm-cut-nothing").wait_for(state="visible")
        elif button == "cancel-job-btn":
            page.locator("#confirm-cancel").wait_for(state="visible")
        elif button in ("flag-btn", "comment-btn"):
            self.rv.expect_text("#notes-error", "Type")  # nothing typed: said, nothing sent

    def undoable(self, button: str) -> None:
        """Undo and Redo are off until there is something to undo or redo: make it, then click."""
        if button == "undo-btn":
            prev = self.cur
            self.relabel()
            self.click(button)
            self.wait_label(prev, "Undo clicked")
        elif button == "redo-btn":
            prev = self.cur
            self.relabel()
            done = self.cur
            self.rv.page.keyboard.press("Control+z")
            self.wait_label(prev, "Ctrl+Z before Redo")
            self.click(button)
            self.wait_label(done, "Redo clicked")
        else:
            self.click(button)
            if button == "reset-btn":
                self.wait_label(None, "Reset clicked")


@contextmanager
def pressed(p: Panel, button: str, key: str) -> Iterator[None]:
    """What a key did, with the button clicked before it and the focus named in a failure."""
    try:
        yield
    except AssertionError as e:
        raise AssertionError(f"{key} after clicking #{button} (focus: {p.rv.focused()}): {e}") from None


@pytest.mark.timeout(420)
@pytest.mark.parametrize("key", ["n", "s"])
def test_n_and_s_open_another_job_whatever_button_has_focus(page: Panel, key: str) -> None:
    p = page
    for button in BUTTONS:
        p.undoable(button)
        left, version = p.job, p.snap["version"]
        p.rv.page.keyboard.press(key)
        with pressed(p, button, key):
            p.settle(left)
            was = p.api.get(left)
            assert was["version"] == version and was["active_pause"], "the job left was changed"
            assert was["claim"] is None, "the job left is still claimed"
            if key == "s":
                p.rv.expect_text("#banner", f"Skipped {left}")


@pytest.mark.timeout(420)
def test_enter_submits_the_boxes_whatever_button_has_focus(page: Panel) -> None:
    p = page
    for button in BUTTONS:
        opened, opened_version = p.job, p.snap["version"]
        p.undoable(button)
        job, version = p.job, p.snap["version"]
        p.rv.page.keyboard.press("Enter")
        with pressed(p, button, "Enter"):
            after = p.api.wait(job, lambda s, v=version: s["version"] > v, "submission")
            assert after["status"] not in ("CANCELLED", "EMPTY_SELECTION") and after["approved_box_list"], after
            p.rv.expect_text("#banner", re.compile(r"Submitted|The job ended|Your review was accepted"))
            assert p.shown() == job, "another job is on screen"
            if job != opened:  # the job the click left is untouched
                assert p.api.get(opened)["version"] == opened_version, "the job the click left was changed"
        p.api.cancel(job)  # no later round of it for N to find
        p.rv.page.locator("#next-job-btn").click()
        p.settle(job)


@pytest.mark.timeout(420)
def test_number_keys_label_the_selected_box_whatever_button_has_focus(page: Panel) -> None:
    p = page
    for button in BUTTONS:
        if button in ("undo-btn", "redo-btn"):
            p.relabel()  # something to undo (and, after Ctrl+Z, to redo)
            if button == "redo-btn":
                done = p.cur
                p.rv.page.keyboard.press("Control+z")
                p.wait(lambda d=done: p.label() != d, "Ctrl+Z before Redo")
                p.cur = p.label()
        if button == "label-btn-1" and p.cur == LABELS[0]:
            p.relabel(LABELS[0])
        if button not in MOVES:
            p.select()
        before = p.cur
        p.click(button)
        if button in MOVES:
            # On the job just opened the key labels the box selected there (the box list selects one), or the
            # page says to select one first: either way the panel's answer, not the focused button pressed again.
            p.rv.page.keyboard.press("1")
            with pressed(p, button, "1"):
                p.wait(lambda: LABELS[0] in p.labels() or NO_SELECTION in p.rv.page.inner_text("#review-error"), "1")
                assert p.shown() == p.job, "the key pressed the focused button"
            p.cur = p.label()
            continue
        if button == "label-btn-1":
            p.wait_label(LABELS[0], "label button 1 clicked")
        elif button in ("undo-btn", "redo-btn", "reset-btn"):
            p.wait(lambda b=before: p.label() != b, f"the change of {button}")
            p.cur = p.label()
        d = p.fresh_digit()
        p.rv.page.keyboard.press(str(d))
        with pressed(p, button, str(d)):
            p.wait_label(LABELS[d - 1], "the number key")


@pytest.mark.timeout(420)
def test_ctrl_z_undoes_the_last_edit_whatever_button_has_focus(page: Panel) -> None:
    p = page
    for button in BUTTONS:
        if button in MOVES:  # the job it opens gets this browser's kept edits back: something to undo
            nxt = p.stack.next_job([p.job])
            assert nxt is not None
            p.plant_draft(nxt, LABELS[1])
            p.click(button)
            assert p.job == nxt, (p.job, nxt)
            p.rv.expect_text("#banner", "Restored your unsent edits")
            p.wait_label(LABELS[1], "the kept draft restored")
            p.rv.page.keyboard.press("Control+z")
            with pressed(p, button, "Ctrl+Z"):
                p.wait_label(None, "Ctrl+Z on the restored edits")
            continue
        start = p.cur
        p.relabel(LABELS[0] if button == "label-btn-1" else None)
        first = p.cur
        if button == "undo-btn":  # a second edit for the button to undo; Ctrl+Z undoes the first
            p.relabel()
            p.click(button)
            p.wait_label(first, "Undo clicked")
            want = start
        elif button == "redo-btn":  # undone, redone by the button; Ctrl+Z undoes it again
            p.rv.page.keyboard.press("Control+z")
            p.wait_label(start, "Ctrl+Z before Redo")
            p.click(button)
            p.wait_label(first, "Redo clicked")
            want = start
        elif button == "reset-btn":  # the reset is an edit too: Ctrl+Z undoes it
            p.click(button)
            p.wait_label(None, "Reset clicked")
            want = first
        elif button == "label-btn-1":  # the button labels the selected box: Ctrl+Z undoes that
            p.select()
            p.click(button)
            p.wait_label(LABELS[0], "label button 1 clicked")
            want = first
        else:
            p.click(button)
            want = start
        p.rv.page.keyboard.press("Control+z")
        with pressed(p, button, "Ctrl+Z"):
            p.wait_label(want, "Ctrl+Z")
