"""Claims and presence in the reviewer app's callbacks, against the control plane (``api_server``),
no browser: opening claims, the queue says who is reviewing, "next job" skips claimed jobs, a
takeover stops the other's editing, and a submission echoes the snapshot (docs/protocol.md § Claims,
§ Snapshot echo and the fifth gate)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gradio as gr

from harness.tokens import TOKENS
from hitl_review.client import HitlClient
from hitl_review.ui import claims
from hitl_review.ui.claims import claim_text
from hitl_review.ui.panel import short_snapshot
from hitl_review.ui.session import ReviewerState
from tests.test_ui_callbacks import make_callbacks, visible, waiting_job


def test_claim_presence_next_job_and_takeover(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job1, job2 = waiting_job(api_server.url, 41), waiting_job(api_server.url, 42)
    a = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    b = ReviewerState(token=TOKENS["rev2"], signed_in=True)

    out = cb.open_job(a, job1)
    assert visible(out[comps.review_col.style]) and not visible(out[comps.takeover_btn])
    assert a.claimed == job1 and a.reviewer == "rev1" and "You are reviewing" in out[comps.claim_md]
    assert a.panel is not None and f"snapshot `{short_snapshot(a.panel.snapshot_id)}`" in out[comps.stage_md]

    out = cb.open_job(b, job1)  # rev2 sees who has it, and cannot edit
    assert not out[comps.submit_btn]["interactive"] and visible(out[comps.takeover_btn])
    assert "has this job" in cb.on_submit(b, out[comps.annotator])[comps.review_error]
    assert "rev1 is reviewing —" in out[comps.claim_md] and "s left" in out[comps.claim_md]
    table = cb.on_tick(b)[comps.queue_table]
    who = dict(zip(table["Job"], table["Reviewer"], strict=True))
    assert who[job1] == "rev1 is reviewing"

    out = cb.on_next(b)  # N: not job1 (claimed by rev1); the job it opens is now rev2's
    assert b.job_id not in (None, job1) and b.claimed == b.job_id and visible(out[comps.review_col.style])
    assert cb.on_tick(a)[comps.queue_table].set_index("Job").loc[b.job_id, "Reviewer"] == "rev2 is reviewing"
    assert cb.on_tick(b)[comps.queue_table].set_index("Job").loc[b.job_id, "Reviewer"] == "you are reviewing"

    cb.open_job(b, job1)  # back to job1: the other job's claim is released
    with HitlClient(api_server.url, TOKENS["rev1"]) as rev1:
        claims = {j.job_id: j.claim for j in rev1.list_jobs(status="WAITING", limit=200).jobs}
    held = claims.get(job2)
    assert held is None or held.reviewer != "rev2"
    out = cb.on_take_over(b)
    assert out[comps.annotator] is None  # emptied, then drawn once its column shows
    out = cb.after_take_over(b)
    assert (
        visible(out[comps.review_col.style])
        and out[comps.annotator]["boxes"]
        and b.claimed == job1
        and "You took this job over" in out[comps.banner_md]
    )

    a.renewed_at = 0.0  # the next tick renews: refused, rev2 has it now
    out = cb.on_tick(a)
    assert "rev2 took this job over" in out[comps.banner_md] and not out[comps.submit_btn]["interactive"]
    assert visible(out[comps.takeover_btn]) and "took this job over" in claim_text(a)

    assert b.panel is not None
    shown = b.panel
    b.panel = dataclasses.replace(shown, snapshot_id="snap_" + "0" * 20)  # as if drawn from another snapshot
    value = cb.view(b, redraw=True)[comps.annotator]
    out = cb.on_submit(b, value)
    assert "boxes waiting now are not the ones you reviewed" in out[comps.banner_md], out[comps.banner_md]
    # Submit's answer names three outputs (Components.answer_outputs); the panel is drawn by the event its
    # redraw_key sets off, and the panel's update after an answer has nothing to do
    assert comps.annotator not in out and out[comps.redraw_key]
    assert {id(k) for k in out} <= {id(o) for o in comps.answer_outputs()}
    assert list(cb.after_submit(b)) == [{comps.banner_md: gr.skip()}]
    assert b.panel is not None and b.panel.snapshot_id == shown.snapshot_id
    out = cb.on_conflict_view(b)
    assert "boxes waiting now are not the ones you reviewed" in out[comps.banner_md], out[comps.banner_md]
    assert cb.on_conflict_view(b) == {comps.banner_md: gr.skip()}  # drawn once
    out = cb.on_submit(b, out[comps.annotator])
    assert out[comps.banner_md].startswith("Submitted —"), out[comps.banner_md]
    assert {id(k) for k in out} <= {id(o) for o in comps.answer_outputs()}
    after, last = cb.after_submit(b)  # the panel's update that follows the answer: the review closed
    assert {id(k) for k in after} <= {id(o) for o in comps.submit_outputs()} and comps.annotator not in after
    assert not visible(after[comps.review_col.style]) and after[comps.draft_out]
    assert comps.banner_md not in after  # the answer's banner stays
    assert last == {comps.banner_md: gr.skip()}  # Gradio repeats a generator's last update: not the view
    assert list(cb.after_submit(b)) == [{comps.banner_md: gr.skip()}]  # once
    assert b.claimed is None
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:
        admin.cancel(job2)  # the server is shared by the session: leave no job waiting in others' queues


def test_a_page_left_on_another_job_is_drawn_again_by_the_timer(api_server: Any, tmp_path: Path) -> None:
    """The session holds (and the timer renews) a claim on the job it opened; a page whose last view names
    another job (an update of the job left landed after the next job's panel) is drawn again once that
    has lasted ``UNSEEN_REDRAW_S`` under the same opening, by the event a 409's redraw uses. An opening
    whose update is on its way (a tick in between), or an emission or submission in flight, sets off
    nothing."""
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    old, job = waiting_job(api_server.url, 43), waiting_job(api_server.url, 44)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    cb.open_job(st, job)
    assert comps.redraw_key not in cb.on_tick(st, job)  # the page shows it
    assert comps.redraw_key not in cb.on_tick(st, old)  # first seen behind: the opening may be on its way
    assert st.unseen is not None and st.unseen[0] == job
    st.emitting = 1  # a follower's update in flight: not judged meanwhile
    assert comps.redraw_key not in cb.on_tick(st, old) and st.unseen is None
    st.emitting = 0
    cb.on_tick(st, old)
    assert st.unseen is not None
    st.unseen = (st.unseen[0], st.unseen[1], st.unseen[2] - claims.UNSEEN_REDRAW_S)  # it has lasted
    out = cb.on_tick(st, old)
    assert out[comps.redraw_key].startswith(f"{job}|unseen|") and st.conflict_view == (True, None)
    drawn = cb.on_conflict_view(st)  # the redraw event: the open job's panel, its canvas included
    assert drawn[comps.current_job] == job and comps.annotator in drawn and visible(drawn[comps.review_col.style])
    assert st.conflict_view is None and comps.redraw_key not in cb.on_tick(st, job)
    cb.open_job(st, old)  # another opening: the time behind starts again
    st.unseen = (job, st.follow_gen - 1, 0.0)
    assert comps.redraw_key not in cb.on_tick(st, job) and st.unseen[:2] == (old, st.follow_gen)
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:
        for j in (old, job):  # the server is shared by the session: leave no job waiting
            admin.cancel(j)


def test_a_page_left_on_a_closed_round_of_its_job_is_drawn_again_by_the_timer(api_server: Any, tmp_path: Path) -> None:
    """Within the open job: the update that closed a submitted round may land after the follower's panel of
    the round the validator opened next (two events, no order between them), leaving the page with no
    panel under "round 2 is open below" while the session holds round 2. The page's last view names the
    pause it showed (``shown_pause``); once the page has shown another pause than the session's for
    ``UNSEEN_REDRAW_S``, the timer has the panel drawn again."""
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 47)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    opened = cb.open_job(st, job)
    assert st.panel is not None
    token = st.panel.pause_token
    assert opened[comps.shown_pause] == token  # every view names the pause it shows
    assert comps.redraw_key not in cb.on_tick(st, job, token)  # the page shows it
    assert comps.redraw_key not in cb.on_tick(st, job, "") and st.unseen is not None  # behind: maybe on its way
    st.unseen = (st.unseen[0], st.unseen[1], st.unseen[2] - claims.UNSEEN_REDRAW_S)  # it has lasted
    out = cb.on_tick(st, job, "")
    assert out[comps.redraw_key].startswith(f"{job}|unseen|") and st.conflict_view == (True, None)
    drawn = cb.on_conflict_view(st)
    assert drawn[comps.shown_pause] == token and comps.annotator in drawn and visible(drawn[comps.review_col.style])
    assert comps.redraw_key not in cb.on_tick(st, job, token) and st.unseen is None
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:
        admin.cancel(job)


def test_n_with_every_other_waiting_job_held_says_by_whom(api_server: Any, tmp_path: Path) -> None:
    """N when no job is free: the banner tells "every other one is being reviewed by someone else" (and by
    whom) from "none is waiting", and the page keeps its own job and claim."""
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:  # jobs an earlier test left waiting: not ours
        for left in admin.list_jobs(status="WAITING", limit=200).jobs:
            admin.cancel(left.job_id)
    job1, job2 = waiting_job(api_server.url, 45), waiting_job(api_server.url, 46)
    a = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    b = ReviewerState(token=TOKENS["rev2"], signed_in=True)
    try:
        cb.open_job(a, job1)
        cb.open_job(b, job2)
        out = cb.on_next(b)
        assert out[comps.banner_md] == "No other job is free: the other waiting job is being reviewed by rev1."
        assert b.job_id == job2 and b.claimed == job2
        with HitlClient(api_server.url, TOKENS["rev1"]) as rev1:
            rev1.release(job1)
        a.claimed = None
        out = cb.on_next(b)  # job1 is free now: N opens it
        assert b.job_id == job1 and b.claimed == job1 and comps.annotator in out
        with HitlClient(api_server.url, TOKENS["admin"]) as admin:
            admin.cancel(job2)
        assert cb.on_next(b)[comps.banner_md] == "No other job is waiting for review."
    finally:
        with HitlClient(api_server.url, TOKENS["admin"]) as admin:
            for job in (job1, job2):
                if admin.get_job(job).status != "CANCELLED":
                    admin.cancel(job)
