"""Review coordination in a real browser: headless Debian Chromium driven by Playwright against ONE
real `hitl up` (embedded Redis, local Ray, Ray Serve, the Gradio UI) started with the test identities
(HITL_TOKENS), so the UI asks each reviewer to sign in and rev1 and rev2 are two people
(docs/protocol.md § Claims, § Snapshot echo and the fifth gate, § Rebase help).

1. rev1 opens a job: rev2's queue says "rev1 is reviewing" on it, opening it shows who and for how
   long (no editing, a "Take over" button), and N takes rev2 to another job;
2. rev2 takes a job over from rev1: rev1 is told on its next renewal and stops editing;
3. rev1 edits a review while rev2 submits a change of the same pause through the API: rev1's edits
   that touch no box rev2 changed are laid over the new round at once, the one rev2 also changed is
   marked for a decision, nothing is retyped. rev1's own submission of round 1 gets a 409 when the page
   still shows round 1 as it clicks; the live updater may draw round 2 first (then there is nothing to
   submit): the new round is drawn once, with the edits on it, either way.
4. A quorum of two (docs/protocol.md § Quorum): rev1's submission is recorded as a vote (the job still
   waits, rev2's page says who has submitted), rev2's agreeing submission moves the job on.

The module prints its wall time. HITL_SCREENSHOTS=1 saves docs/screenshots/{queue-presence,
conflict-rebase}.png. Under CI=true a missing Chromium fails the module; locally it skips.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.hitl_up import HitlUp
from harness.tokens import TOKENS
from hitl_review.client import HitlClient, new_intervention_id
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.ui.claims import CLAIM_RENEW_S
from hitl_review.ui.panel import ROUND1_TEXT, ROUND2_TEXT

from .browser_stack import shared_ui_up, signed_in_maker
from .browser_util import (
    WAIT_MS,
    Api,
    Reviewer,
    screenshot,
)

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.slow]

GHOST_LEFT = [20.0, 10.0, 200.0, 60.0]  # empty background above product_composite's objects
GHOST_RIGHT = [430.0, 10.0, 620.0, 60.0]
RENEWAL_WAIT_MS = 20_000  # the page renews every 5 s (ui.claims.CLAIM_RENEW_S) on a 2 s tick


SHARED_UI = "signed-in"  # one `hitl up` with the notes' and the accounts' modules (tests/browser_stack.py)


class Stack:
    def __init__(self, up: HitlUp) -> None:
        self.up = up
        self.ui_url = up.ui_url or ""
        self.api = Api(up.api_url, TOKENS["admin"])
        self.created: list[str] = []

    def waiting(self, seed: int, review_quorum: int = 1) -> dict[str, Any]:
        job = self.api.submit(product_composite(seed, 640, 480, n=2)[0], review_quorum)
        self.created.append(job)
        return self.api.wait_round(job, 1)


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # the box stages' coordination; the mask review: test_mask_review_browser
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


def size(snap: dict[str, Any]) -> tuple[int, int]:
    return snap["image"]["width"], snap["image"]["height"]


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect  # imported late: a missing Playwright skips the module

    return pw_expect(locator)


def press_n(rv: Reviewer) -> None:
    rv.page.evaluate("document.activeElement && document.activeElement.blur()")
    rv.page.keyboard.press("n")


@pytest.mark.timeout(240)
def test_presence_in_the_queue_and_n_skips_a_job_claimed_by_another(
    stack: Stack, reviewer: Callable[[str, str | None], Reviewer]
) -> None:
    first, other = stack.waiting(51), stack.waiting(52)
    job = first["job_id"]
    rev1 = reviewer("rev1", job)
    rev1.wait_panel(ROUND1_TEXT, first["active_pause"]["pause_token"])
    rev1.expect_text("#claim-note", "You are reviewing this job")
    rev1.expect_text("#stage-text", "snapshot " + first["active_pause"]["snapshot_id"][:13])
    assert stack.api.get(job)["claim"]["reviewer"] == "rev1"

    rev2 = reviewer("rev2", None)

    row = rev2.page.locator("#queue-table").get_by_role("row", name=re.compile(re.escape(job) + ".*rev1 is reviewing"))
    row.first.wait_for(state="visible", timeout=WAIT_MS)  # the row says who has it
    screenshot(rev2.page, "queue-presence")
    rev2.open_from_queue(job)
    rev2.expect_text("#claim-note", re.compile(r"rev1 is reviewing — \d+ s left"))
    rev2.page.locator("#takeover-btn").wait_for(state="visible")
    expect(rev2.page.locator("#submit-btn")).to_be_disabled()  # no submitting under another's claim

    press_n(rev2)
    rev2.expect_text("#job-id", other["job_id"])
    rev2.wait_panel(ROUND1_TEXT, other["active_pause"]["pause_token"])
    rev2.expect_text("#claim-note", "You are reviewing this job")
    expect(rev2.page.locator("#submit-btn")).to_be_enabled()
    assert stack.api.get(other["job_id"])["claim"]["reviewer"] == "rev2"
    assert stack.api.get(job)["claim"]["reviewer"] == "rev1"  # rev1's claim untouched
    for j in (job, other["job_id"]):
        stack.api.cancel(j)


@pytest.mark.timeout(240)
def test_take_over_tells_the_first_reviewer_and_stops_its_editing(
    stack: Stack, reviewer: Callable[[str, str | None], Reviewer]
) -> None:
    snap = stack.waiting(53)
    job, token = snap["job_id"], snap["active_pause"]["pause_token"]
    rev1 = reviewer("rev1", job)
    rev1.wait_panel(ROUND1_TEXT, token)
    rev2 = reviewer("rev2", job)
    rev2.expect_text("#claim-note", "rev1 is reviewing")
    rev2.page.locator("#takeover-btn").click()
    rev2.wait_panel(ROUND1_TEXT, token)
    rev2.expect_text("#claim-note", "You are reviewing this job")
    assert stack.api.get(job)["claim"]["reviewer"] == "rev2"

    rev1.expect_text("#banner", "rev2 took this job over", timeout=RENEWAL_WAIT_MS)
    rev1.expect_text("#claim-note", "rev2 took this job over")
    expect(rev1.page.locator("#submit-btn")).to_be_disabled()
    rev1.page.locator("#takeover-btn").wait_for(state="visible")
    stack.api.cancel(job)


@pytest.mark.timeout(300)
def test_conflicting_submission_rebases_the_reviewers_edits(
    stack: Stack, reviewer: Callable[[str, str | None], Reviewer]
) -> None:
    snap = stack.waiting(54)
    job, pause = snap["job_id"], snap["active_pause"]
    first, second = snap["box_list"][0], snap["box_list"][1]
    rev1 = reviewer("rev1", job)
    rev1.wait_panel(ROUND1_TEXT, pause["pause_token"])
    # rev1: names the first box "bag" (key 2), deletes the second, draws and names a new one.
    rev1.select_box(first["bbox"], size(snap))
    rev1.page.keyboard.press("2")
    rev1.expect_text("#box-notes", "relabelled 1")
    rev1.remove_box(second["bbox"], size(snap))
    rev1.draw_box(GHOST_LEFT, size(snap))
    rev1.label_new_box("ghost")
    rev1.expect_text("#box-notes", "deleted 1, relabelled 1, drew 1 new")

    # Meanwhile rev2 answers the same pause through the API: the first box becomes "boot", the second
    # stays, a box drawn over empty background (it fails naming: round 2 opens).
    with HitlClient(stack.up.api_url, TOKENS["rev2"]) as rev2:
        rev2.intervene(
            job,
            intervention_id=new_intervention_id(),
            pause_token=pause["pause_token"],
            base_version=pause["base_version"],
            subjects=[
                {"box_id": first["box_id"], "bbox": first["bbox"], "label": "boot"},
                {"box_id": second["box_id"], "bbox": second["bbox"], "label": second["label"]},
                {"bbox": GHOST_RIGHT, "label": "ghost-b"},
            ],
            snapshot_id=pause["snapshot_id"],
        )
    # rev1 submits its round-1 edits (refused: 409) unless the page already shows round 2 (the live
    # updater drew it first): checked and clicked in one step of the page's script. Rebased either way.
    rev1.page.evaluate(
        """(token) => {
          if (document.querySelector('#stage-text').innerText.includes(token)) {
            document.querySelector('#submit-btn').click();
          }
        }""",
        pause["pause_token"],
    )

    snap2 = stack.api.wait_round(job, 2)
    token2 = snap2["active_pause"]["pause_token"]
    rev1.wait_panel(ROUND2_TEXT, token2)
    rev1.expect_text("#banner", "Your edits were re-applied onto the current boxes (deleted 1, drew 1 new)")
    rev1.expect_text("#banner", "Needs your decision (1)")
    rev1.expect_text("#banner", re.compile(r"you named it “bag”, but meanwhile it was named “boot”"))
    rev1.expect_text("#box-notes", "deleted 1, drew 1 new")
    rev1.page.locator("#reapply-btn").wait_for(state="visible")  # "use mine" for the conflicting box
    screenshot(rev1.page, "conflict-rebase", full_page=True)
    # the rebased edits are the new round's draft: nothing to retype (kept by the page's script once drawn)
    rev1.page.wait_for_function("(k) => localStorage.getItem(k) !== null", arg=f"hitl-draft:{job}:{token2}")
    kept = rev1.draft(job, token2)
    assert kept is not None, "no draft kept for the new round"
    draft = kept["draft"]
    assert draft["deleted"] == [second["box_id"]] and draft["relabelled"] == {}
    assert [(a["label"], a["bbox"]) for a in draft["added"]] == [("ghost", pytest.approx(GHOST_LEFT, abs=3))]

    rev1.page.locator("#reapply-btn").click()  # decide for "bag"
    rev1.expect_text("#box-notes", "deleted 1, relabelled 1, drew 1 new")
    stack.api.cancel(job)


@pytest.mark.timeout(240)
def test_a_quorum_of_two_needs_both_reviewers(stack: Stack, reviewer: Callable[[str, str | None], Reviewer]) -> None:
    snap = stack.waiting(55, review_quorum=2)
    job, token = snap["job_id"], snap["active_pause"]["pause_token"]
    assert snap["quorum"] == {"needed": 2, "invited": 2, "policy": "all", "votes": []}
    rev1 = reviewer("rev1", job)
    rev1.wait_panel(ROUND1_TEXT, token)
    rev1.expect_text("#stage-text", "Needs 2 reviewers whose boxes agree — 0 of 2 submitted")
    rev1.ready_to_submit()
    rev1.click_submit_now()
    rev1.expect_text("#banner", "Your boxes are recorded — 1 of 2 reviewers")
    after = stack.api.get(job)
    assert after["status"] == "WAITING_USER_SELECTION" and after["version"] == snap["version"]  # a vote only
    assert [v["reviewer"] for v in after["quorum"]["votes"]] == ["rev1"] and after["claim"] is None
    # rev1's page keeps the job closed to them, so its timer does not claim it again (it did, once the
    # vote's event came back): past two renewal periods the job is still free for the second reviewer.
    until = time.monotonic() + 2 * CLAIM_RENEW_S + 3
    while time.monotonic() < until:
        assert stack.api.get(job)["claim"] is None, "rev1's page claimed the job it voted on again"
        time.sleep(0.5)
    assert not rev1.page.locator("#submit-btn").is_visible()  # no panel on rev1's page: their part is done

    rev2 = reviewer("rev2", job)
    rev2.wait_panel(ROUND1_TEXT, token)
    rev2.expect_text("#stage-text", "1 of 2 submitted (rev1)")
    rev2.ready_to_submit()
    rev2.click_submit_now()
    # The agreement's banner, or already the job's end that replaces it (classical models finish in well under a second)
    rev2.expect_text("#banner", re.compile(r"2 reviewers agreed \(rev1, rev2\)|The job ended: SUCCEEDED"))
    done = stack.api.wait(job, lambda s: s["status"] in ("SUCCEEDED", "PARTIAL_SUCCEEDED"), "the job's end")
    assert done["quorum"]["votes"] == []
    types = [e["type"] for e in stack.api.events(job)]
    assert types.count("QUORUM_VOTE") == 1 and types.count("QUORUM_REACHED") == 1
    assert types.count("INTERVENTION_ACCEPTED") == 1  # the pause consumed once, by the second reviewer
