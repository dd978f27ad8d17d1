"""Skip, flag for a lead and comments in a real browser: headless Debian Chromium driven by Playwright
against ONE real `hitl up` (embedded Redis, local Ray, Ray Serve, the Gradio UI) started with the test
identities (HITL_TOKENS), so each reviewer signs in and rev1 and rev2 are two people
(docs/protocol.md § Flags, skips and comments; ui.notes_view).

1. S skips the open job: the page opens another one as N does, the skipped job keeps waiting without
   a claim (audited SKIP), and N does not offer it to that reviewer again (another reviewer still
   gets it);
2. a flag with a reason shows on the job's panel and in the queue ("⚑ reason"), "Flagged only" lists
   the flagged job alone, the flag is in the job's snapshot and audit, and Unflag takes it off;
3. a comment rev1 adds is shown above the panel to rev2 when rev2 opens the job, and one rev1 adds
   while rev2 has the job open reaches rev2's page without a reload.

The keys on every button of the panel: tests/test_keys_browser.py. The module prints its wall time.
HITL_SCREENSHOTS=1 saves docs/screenshots/notes-flag.png and notes-comments.png.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.hitl_up import HitlUp
from harness.tokens import TOKENS
from hitl_review.client import HitlClient
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.ui.panel import ROUND1_TEXT

from .browser_stack import shared_ui_up, signed_in_maker
from .browser_util import (
    Api,
    Reviewer,
    screenshot,
)

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.slow]


SHARED_UI = "signed-in"  # one `hitl up` with the review coordination's and the accounts' modules


class Stack:
    def __init__(self, up: HitlUp) -> None:
        self.up = up
        self.ui_url = up.ui_url or ""
        self.api = Api(up.api_url, TOKENS["admin"])
        self.created: list[str] = []

    def waiting(self, seed: int) -> dict[str, Any]:
        job = self.api.submit(product_composite(seed, 640, 480, n=2)[0])
        self.created.append(job)
        return self.api.wait_round(job, 1)

    def client(self, name: str) -> HitlClient:
        return HitlClient(self.up.api_url, TOKENS[name])


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # the box stages' notes; the mask review: test_mask_review_browser
    with shared_ui_up(request, tmp_path_factory, SHARED_UI) as up:
        s = Stack(up)
        try:
            yield s
        finally:
            s.api.close()


@pytest.fixture(autouse=True)
def no_job_left_waiting(stack: Stack) -> Iterator[None]:
    """A test that fails half-way leaves no waiting job for the next one's N to find."""
    yield
    for job in stack.created:
        stack.api.cancel(job)  # an ended job refuses (409): nothing to do
    stack.created.clear()


@pytest.fixture
def reviewer(browser: Any, stack: Stack) -> Iterator[Callable[[str, str | None], Reviewer]]:
    """``reviewer(name, job)``: a signed-in page of ``name`` (its own browser context), at ``job``."""
    with signed_in_maker(browser, stack.ui_url) as make:
        yield make


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect  # imported late: a missing Playwright skips the module

    return pw_expect(locator)


def press(rv: Reviewer, key: str) -> None:
    """A key pressed with nothing in particular focused."""
    rv.page.evaluate("document.activeElement && document.activeElement.blur()")
    rv.page.keyboard.press(key)


def field(rv: Reviewer, elem_id: str) -> Any:
    return rv.page.locator(f"#{elem_id} input, #{elem_id} textarea").first


@pytest.mark.timeout(240)
def test_s_skips_the_job_and_n_does_not_offer_it_again(
    stack: Stack, reviewer: Callable[[str, str | None], Reviewer]
) -> None:
    first, other = stack.waiting(71), stack.waiting(72)
    job = first["job_id"]
    rv = reviewer("rev2", job)
    rv.wait_panel(ROUND1_TEXT, first["active_pause"]["pause_token"])
    rv.expect_text("#claim-note", "You are reviewing this job")
    assert stack.api.get(job)["claim"]["reviewer"] == "rev2"

    press(rv, "s")
    rv.expect_text("#banner", f"Skipped {job}")
    rv.expect_text("#job-id", other["job_id"])  # opened as N opens the next job
    rv.wait_panel(ROUND1_TEXT, other["active_pause"]["pause_token"])
    rv.expect_text("#claim-note", "You are reviewing this job")
    snap = stack.api.get(job)
    assert snap["claim"] is None and snap["active_pause"] == first["active_pause"]  # handed back, still waiting
    assert snap["version"] == first["version"]
    with stack.client("rev2") as rev2:
        skips = [e["actor"] for e in rev2.audit(job)["entries"] if e["action"] == "SKIP"]
    assert skips == ["rev2"]

    press(rv, "n")  # the only other waiting job is the skipped one: N does not offer it
    rv.expect_text("#banner", "No other job is waiting for review.")
    rv.expect_text("#job-id", other["job_id"])
    with stack.client("rev1") as rev1:  # another reviewer's next job is still the skipped one
        found = rev1.next_job(exclude=[other["job_id"]])
    assert found is not None and found.job_id == job


@pytest.mark.timeout(240)
def test_a_flag_shows_in_the_queue_and_flagged_only_lists_it(
    stack: Stack, reviewer: Callable[[str, str | None], Reviewer]
) -> None:
    snap, other = stack.waiting(73), stack.waiting(74)
    job, reason = snap["job_id"], "the boxes cut the bag in half"
    rv = reviewer("rev1", job)
    rv.wait_panel(ROUND1_TEXT, snap["active_pause"]["pause_token"])
    rv.page.locator("#flag-btn").click()  # nothing typed: said, nothing sent
    rv.expect_text("#notes-error", "Type why a lead should look")
    field(rv, "flag-reason").fill(reason)
    rv.page.locator("#flag-btn").click()
    rv.expect_text("#flag-note", "Flagged for a lead by you")
    rv.expect_text("#flag-note", reason)
    rv.page.locator("#unflag-btn").wait_for(state="visible")
    expect(field(rv, "flag-reason")).to_have_value("")
    rv.expect_text("#queue-table", f"⚑ {reason}")  # the next queue refresh marks the row
    flagged = stack.api.get(job)
    assert flagged["flag"]["by"] == "rev1" and flagged["flag"]["reason"] == reason
    assert flagged["active_pause"] == snap["active_pause"] and flagged["version"] == snap["version"]
    with stack.client("rev1") as rev1:
        outcomes = [e["outcome"] for e in rev1.audit(job)["entries"] if e["action"] == "FLAG"]
    assert outcomes == [f"FLAGGED:{reason}"]

    rv.expect_text("#queue-table", other["job_id"])
    rv.page.locator("#flagged-only input").check()  # a lead's list: the flagged job alone
    rv.expect_no_text("#queue-table", other["job_id"])
    rv.expect_text("#queue-table", job)
    rv.expect_text("#queue-note", "1 of 2 jobs waiting")
    screenshot(rv.page, "notes-flag", full_page=True)

    rv.page.locator("#unflag-btn").click()
    rv.expect_text("#banner", "The flag was taken off.")
    expect(rv.page.locator("#flag-note")).to_have_text("")
    assert stack.api.get(job)["flag"] is None
    rv.expect_no_text("#queue-table", job)  # "Flagged only" still on: nothing is flagged now
    rv.page.locator("#flagged-only input").uncheck()
    rv.expect_text("#queue-table", other["job_id"])


@pytest.mark.timeout(240)
def test_a_comment_by_one_reviewer_is_shown_to_the_next(
    stack: Stack, reviewer: Callable[[str, str | None], Reviewer]
) -> None:
    snap = stack.waiting(75)
    job, text = snap["job_id"], "box 2 is a reflection in the glass — please delete it"
    a = reviewer("rev1", job)
    a.wait_panel(ROUND1_TEXT, snap["active_pause"]["pause_token"])
    box = field(a, "comment-text")
    box.fill(text)
    box.press("Enter")  # Enter in the field adds it, as the button does
    a.expect_text("#job-comments", "Comments (1)")
    a.expect_text("#job-comments", "rev1 · ")
    a.expect_text("#job-comments", text)
    expect(box).to_have_value("")
    press(a, "s")  # rev1 hands it back; nothing else waits, so the page closes it
    a.expect_text("#banner", "No other job is waiting for review.")
    a.expect_text("#job-id", "No job open")
    assert stack.api.get(job)["claim"] is None

    b = reviewer("rev2", job)
    b.wait_panel(ROUND1_TEXT, snap["active_pause"]["pause_token"])
    b.expect_text("#job-comments", "Comments (1)")
    b.expect_text("#job-comments", "rev1")
    b.expect_text("#job-comments", text)
    b.expect_text("#claim-note", "You are reviewing this job")
    field(b, "comment-text").fill("agreed, deleting it")
    b.page.locator("#comment-btn").click()
    b.expect_text("#job-comments", "Comments (2)")
    screenshot(b.page, "notes-comments", full_page=True)
    comments = stack.api.get(job)["comments"]
    assert [(c["by"], c["text"]) for c in comments] == [("rev1", text), ("rev2", "agreed, deleting it")]

    # A colleague's note reaches the open page by itself (its event; the job's version does not move).
    with stack.client("rev1") as rev1:
        rev1.comment(job, "thanks, approved by the lead")
    b.expect_text("#job-comments", "Comments (3)")
    b.expect_text("#job-comments", "thanks, approved by the lead")
