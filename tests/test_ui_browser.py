"""The reviewer UI in a real browser: headless Debian Chromium driven by Playwright,
against ONE real `hitl up` (embedded Redis, local Ray, Ray Serve, the Gradio UI).

1. the main path: queue → job → delete a box, draw + label a box over empty background →
   round 2 shows it as not passing naming → remove it → submit → cut-outs in the results view;
2. two reviewers (two browser contexts) submit the same pause at the same moment: one
   consumption (Redis pause history, one INTERVENTION_ACCEPTED), the other sees plain words
   and the refreshed panel;
3. a reload in the middle of a review shows the same job and the same pause token;
4. a job opened while still DETECTING shows its review panel when PAUSE_OPENED arrives,
   without a reload.

HITL_SCREENSHOTS=1 saves docs/screenshots/{queue,round1,round2,results}.png.
Under CI=true a missing Chromium fails the module; locally it skips.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from harness.hitl_up import HitlUp
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.statecore import keys
from hitl_review.ui.panel import ROUND1_TEXT, ROUND2_TEXT

from .browser_stack import page_maker, ui_up
from .browser_util import (
    Api,
    Reviewer,
    screenshot,
)

pytestmark = [pytest.mark.browser, pytest.mark.ray, pytest.mark.slow]

# The detector sleeps this long per image. Opening a job in a fresh page takes the UI 1–2 s (more on
# a loaded 2-core machine), so test 4 needs detection to outlast a page load: at 300 ms the job is
# already waiting when the page first shows it and the live-panel case is never exercised.
DETECTOR_DELAY_MS = 4000

# Empty studio background: product_composite puts its objects below y≈70 (see serve_app/ops/samples.py),
# so these strips along the top edge hold nothing the validator can name.
GHOST_LEFT = [20.0, 10.0, 200.0, 60.0]
GHOST_RIGHT = [430.0, 10.0, 620.0, 60.0]

OTHER_REVIEWER = re.compile("another reviewer submitted", re.IGNORECASE)


class Stack:
    def __init__(self, up: HitlUp) -> None:
        self.up = up
        self.ui_url = up.ui_url or ""
        self.api = Api(up.api_url, up.token)
        assert up.redis_url, "hitl up did not say where its embedded redis-server is"
        self.redis = redis.Redis.from_url(up.redis_url, decode_responses=True)
        self.jobs: dict[str, str] = {}

    def submit(self, seed: int) -> str:
        return self.api.submit(product_composite(seed, 640, 480, n=2)[0])

    def pause_history(self, job_id: str) -> dict[str, dict[str, Any]]:
        return {str(tok): json.loads(v) for tok, v in self.redis.hgetall(keys.job(job_id).pauses).items()}


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    args = ("--detector-delay-ms", str(DETECTOR_DELAY_MS))
    args += ("--quality-gate", "off")  # the box stages to the cut-outs; the mask review: test_mask_review_browser
    env = {"HITL_LABELS": "shoe,bag,shirt"}  # the screenshots show the label set's buttons
    with ui_up(request, tmp_path_factory.mktemp("hitl-ui"), *args, env=env) as up:
        s = None
        try:
            s = Stack(up)
            # Submitted now, so their (slowed) detection runs while the browser starts.
            for name, seed in (("main", 11), ("race", 12), ("reload", 13)):
                s.jobs[name] = s.submit(seed)
            yield s
        finally:
            if s is not None:
                s.api.close()
                s.redis.close()


@pytest.fixture
def new_reviewer(browser: Any, stack: Stack) -> Iterator[Callable[[], Reviewer]]:
    """Reviewer pages, each in its own browser context (its own Gradio session)."""
    with page_maker(browser, stack.ui_url) as make:
        yield make


def image_size(snap: dict[str, Any]) -> tuple[int, int]:
    return snap["image"]["width"], snap["image"]["height"]


@pytest.mark.timeout(240)
def test_main_path_two_rounds_to_cutouts(stack: Stack, new_reviewer: Callable[[], Reviewer]) -> None:
    api, job = stack.api, stack.jobs["main"]
    snap = api.wait_round(job, 1)
    size, boxes, token1 = image_size(snap), snap["box_list"], snap["active_pause"]["pause_token"]
    assert len(boxes) >= 2, boxes
    victim, kept = boxes[-1], boxes[:-1]

    rv = new_reviewer()
    rv.open_queue()
    rv.queue_row(job).wait_for(state="visible")
    screenshot(rv.page, "queue")
    rv.open_from_queue(job)
    rv.wait_panel(ROUND1_TEXT, token1)
    rv.expect_text("#cancel-job-btn", "Cancel job")  # shown by an update, with its text

    rv.remove_box(victim["bbox"], size)
    rv.expect_text("#box-notes", "deleted 1")
    rv.draw_box(GHOST_RIGHT, size)
    rv.expect_text("#box-notes", "1 new box still needs a label")
    rv.label_new_box("ghost")
    rv.expect_text("#box-notes", "deleted 1, drew 1 new")
    rv.expect_no_text("#box-notes", "needs a label")
    screenshot(rv.page, "round1", full_page=True)

    rv.page.click("#submit-btn")
    rv.wait_panel(ROUND2_TEXT)
    snap2 = api.wait_round(job, 2)
    token2 = snap2["active_pause"]["pause_token"]
    assert token2 != token1
    rv.expect_text("#stage-text", token2)
    rv.expect_text("#box-notes", "Did not pass naming (1)")
    rv.expect_text("#box-notes", "ghost")
    by_id = {b["box_id"]: b for b in snap2["box_list"]}
    assert victim["box_id"] not in by_id
    (bad_id,) = snap2["active_pause"]["box_ids_to_revise"]
    bad = by_id[bad_id]
    assert bad["source"] == "manual" and bad["label"] == "ghost"
    assert bad["bbox"] == pytest.approx(GHOST_RIGHT, abs=3)  # the canvas drag became these image pixels
    screenshot(rv.page, "round2", full_page=True)

    rv.remove_box(bad["bbox"], size)
    rv.expect_text("#box-notes", "deleted 1")
    rv.page.click("#submit-btn")
    rv.page.locator("#results-panel").wait_for(state="visible")
    rv.page.locator("#results-gallery img").first.wait_for(state="visible")
    rv.expect_text("#results-summary", f"{len(kept)} of")
    rv.expect_text("#job-status", re.compile("SUCCEEDED"))
    assert rv.page.locator("#results-gallery img").count() >= len(kept)
    assert not rv.page.locator("#review-panel").is_visible()

    final = api.get(job)
    assert final["status"] in ("SUCCEEDED", "PARTIAL_SUCCEEDED"), final["status"]
    res = api.results(job)
    done = {s["box_id"]: s for s in res["subjects"] if s["status"] == "SUCCEEDED"}
    assert set(done) == {b["box_id"] for b in kept}, res
    assert all(s["cutout_url"] and s["mask_url"] for s in done.values())
    assert victim["box_id"] not in {s["box_id"] for s in res["subjects"]}
    rv.expect_no_text("#queue-table", job)  # the next refresh of the queue drops the ended job
    screenshot(rv.page, "results", full_page=True)


@pytest.mark.timeout(240)
def test_two_reviewers_same_pause_one_consumption(stack: Stack, new_reviewer: Callable[[], Reviewer]) -> None:
    api, job = stack.api, stack.jobs["race"]
    snap = api.wait_round(job, 1)
    size, boxes, token1 = image_size(snap), snap["box_list"], snap["active_pause"]["pause_token"]
    assert len(boxes) >= 2, boxes

    a, b = new_reviewer(), new_reviewer()
    for rv in (a, b):
        rv.open_url(job)
        rv.wait_panel(ROUND1_TEXT, token1)
    # Different edits, so the job tells whose submission it took:
    # A deletes the last box and draws "ghost-a"; B keeps every box and draws "ghost-b".
    a.remove_box(boxes[-1]["bbox"], size)
    a.draw_box(GHOST_LEFT, size)
    a.label_new_box("ghost-a")
    b.draw_box(GHOST_RIGHT, size)
    b.label_new_box("ghost-b")
    a.expect_text("#box-notes", "deleted 1, drew 1 new")
    b.expect_text("#box-notes", "drew 1 new")

    a.ready_to_submit()
    b.ready_to_submit()
    a.click_submit_now()
    b.click_submit_now()

    snap2 = api.wait_round(job, 2)
    token2 = snap2["active_pause"]["pause_token"]
    manual = [x["label"] for x in snap2["box_list"] if x["source"] == "manual"]
    assert manual in (["ghost-a"], ["ghost-b"]), snap2["box_list"]
    a_won = manual == ["ghost-a"]
    winner, loser = (a, b) if a_won else (b, a)
    model_ids = {x["box_id"] for x in snap2["box_list"] if x["source"] == "model"}
    assert model_ids == {x["box_id"] for x in (boxes[:-1] if a_won else boxes)}

    # The loser is told in plain words and its panel is redrawn from the current state: round 2.
    loser.expect_text("#banner", OTHER_REVIEWER)
    for rv in (loser, winner):
        rv.wait_panel(ROUND2_TEXT, token2)
    assert "_CONFLICT" not in loser.page.inner_text("#banner")  # words, not error codes
    # Its refused edits touched no box the winner changed: they are laid over round 2 at once (ui.rebase).
    loser.expect_text("#banner", "Your edits were re-applied onto the current boxes")
    loser.expect_text("#box-notes", "drew 1 new")
    assert not loser.page.locator("#reapply-btn").is_visible()  # nothing left to decide

    # Redis: the round-1 pause was consumed once, by one intervention.
    pauses = stack.pause_history(job)
    assert pauses[token1]["status"] == "CONSUMED"
    consumed_by = pauses[token1]["consumed_by"]["intervention_id"]
    assert [p["round"] for p in pauses.values()].count(1) == 1

    api.cancel(job)  # ends the event stream (JOB_FINISHED) so the whole history can be read
    events = api.events(job, until="JOB_FINISHED")
    accepted = [e for e in events if e["type"] == "INTERVENTION_ACCEPTED"]
    assert len(accepted) == 1, accepted
    assert accepted[0]["data"]["pause_token"] == token1
    assert accepted[0]["data"]["intervention_id"] == consumed_by
    # one atomic write consumed the pause: the version moved from the pause's base by exactly one
    assert accepted[0]["version"] == snap["active_pause"]["base_version"] + 1 == snap["version"] + 1


@pytest.mark.timeout(180)
def test_reload_mid_review_shows_same_job_and_pause(stack: Stack, new_reviewer: Callable[[], Reviewer]) -> None:
    api, job = stack.api, stack.jobs["reload"]
    snap = api.wait_round(job, 1)
    size, token = image_size(snap), snap["active_pause"]["pause_token"]

    rv = new_reviewer()
    rv.open_queue()
    rv.open_from_queue(job)
    rv.wait_panel(ROUND1_TEXT, token)
    rv.page.wait_for_url(re.compile(r"[?&]job=" + re.escape(job)))  # the URL names the open job
    rv.remove_box(snap["box_list"][0]["bbox"], size)  # an unsent edit: the review is under way
    rv.expect_text("#box-notes", "deleted 1")

    rv.page.reload()
    rv.expect_text("#job-id", job)
    rv.wait_panel(ROUND1_TEXT, token)
    assert rv.pause_token_shown() == token
    after = api.get(job)
    assert after["active_pause"]["pause_token"] == token and after["version"] == snap["version"]
    api.cancel(job)


@pytest.mark.timeout(180)
def test_job_opened_while_detecting_shows_panel_live(stack: Stack, new_reviewer: Callable[[], Reviewer]) -> None:
    api = stack.api
    rv = new_reviewer()
    rv.open_queue()  # the app's assets are loaded: opening the job is one quick navigation
    job = stack.submit(14)
    rv.open_url(job)
    status_at_open = rv.page.inner_text("#job-status")
    assert "DETECTING" in status_at_open or "CREATED" in status_at_open, (
        f"the job was no longer detecting when the page showed it: {status_at_open!r}"
    )
    assert not rv.page.locator("#review-panel").is_visible()
    rv.page.evaluate("window.__hitlNoReload = true")

    rv.wait_panel(ROUND1_TEXT)
    token = api.get(job)["active_pause"]["pause_token"]
    rv.expect_text("#stage-text", token)
    rv.expect_text("#job-status", "WAITING_USER_SELECTION")
    assert rv.page.evaluate("window.__hitlNoReload === true"), "the page was reloaded"
    api.cancel(job)
