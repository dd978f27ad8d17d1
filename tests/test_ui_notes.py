"""Skip, flag for a lead and comments on the reviewer page (ui.notes_view, ui.notes_wiring), without a
browser: first the words it shows, then its handlers as ``build_app`` wires them, against the control
plane (``api_server``: a real redis-server and the API in this process). Every handler's answer is
checked against the outputs its event was wired with (Gradio refuses an update of a component that
is not one). A real browser: tests/test_notes_browser.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

from harness.tokens import TOKENS
from hitl_review.client import ApiError, ConflictError, HitlClient
from hitl_review.statecore.models import JobComment, JobFlag, JobSummary
from hitl_review.ui.app import build_app
from hitl_review.ui.mask_review_view import ReviewerCallbacks
from hitl_review.ui.notes_view import NotesView, comments_text, flag_text, md_text, note_error
from hitl_review.ui.queue import queue_rows
from hitl_review.ui.session import ReviewerState
from tests.test_ui_callbacks import updates, visible, waiting_job
from tests.ui_fakes import opened, round1, snapshot

NOW = datetime(2026, 5, 21, 10, 5, tzinfo=UTC)


def summary(job_id: str, flag: JobFlag | None = None) -> JobSummary:
    return JobSummary(
        job_id=job_id,
        status="WAITING_USER_SELECTION",
        version=3,
        created_at="2026-05-21T09:59:00Z",
        updated_at="2026-05-21T10:00:00Z",
        submitter="sub1",
        box_count=2,
        stage="WAITING_USER_SELECTION",
        pause_created_at="2026-05-21T10:00:00Z",
        flag=flag,
    )


# --------------------------------------------------------------------------- what the page says


def test_the_queue_marks_flagged_jobs_and_flagged_only_lists_just_them() -> None:
    flag = JobFlag(by="rev1", reason="a policy question", at="2026-05-21T10:01:00Z")
    jobs = [summary("job_a"), summary("job_b", flag)]
    rows = queue_rows(jobs, now=NOW)
    assert [r[0] for r in rows] == ["job_a", "job_b"]
    assert rows[0][1] == "Confirm boxes (round 1)" and rows[1][1] == "Confirm boxes (round 1) · ⚑ a policy question"
    assert [r[0] for r in queue_rows(jobs, now=NOW, flagged=True)] == ["job_b"]
    long = JobFlag(by="rev1", reason="x" * 500, at="2026-05-21T10:01:00Z")
    assert len(queue_rows([summary("job_c", long)], now=NOW)[0][1]) < 120  # a long reason is cut in the table


def test_flag_and_comments_are_shown_with_who_and_when_and_never_as_markup() -> None:
    flag = JobFlag(by="rev1", reason="ask a *lead* <b>now</b>", at="2026-05-21T10:02:00Z")
    text = flag_text(flag, me="rev2", now=NOW)
    assert text.startswith("⚑ **Flagged for a lead** by rev1 (3 min 00 s ago): ")
    assert "\\*lead\\*" in text and "\\<b\\>" in text
    assert "by you" in flag_text(flag, me="rev1", now=NOW) and flag_text(None) == ""
    comments = [
        JobComment(by="rev1", text="box 2 is a reflection", at="2026-05-21T10:00:00Z"),
        JobComment(by="rev2", text="[link](http://x) # not a title", at="not a time"),
    ]
    shown = comments_text(comments, now=NOW)
    assert shown.splitlines() == [
        "**Comments (2)**",
        "- **rev1** · 5 min 00 s ago: box 2 is a reflection",
        "- **rev2** · not a time: \\[link\\]\\(http://x\\) \\# not a title",
    ]
    assert comments_text([]) == "" and md_text("  a_b  ") == "a\\_b"


def test_refusals_are_said_in_words() -> None:
    def refused(status: int, code: str) -> ApiError:
        return ApiError(status, code, "refused")

    assert "no such job (404)" in note_error(refused(404, "JOB_NOT_FOUND"), "flag")
    assert "no review waits on it now" in note_error(refused(409, "PAUSE_NOT_ACTIVE"), "skip")
    assert "it has ended (JOB_CANCELLED)" in note_error(refused(409, "JOB_CANCELLED"), "comment on")
    assert "did not accept your token (401)" in note_error(refused(401, "UNAUTHORIZED"), "flag")
    assert "may not do this (403)" in note_error(refused(403, "FORBIDDEN"), "flag")
    assert note_error(OSError("connection refused"), "flag").startswith("Could not flag this job: Could not reach")


# --------------------------------------------------------------------------- the handlers, against the control plane


class Page:
    """The page as ``build_app`` wires it: the notes' handlers and the outputs of their events."""

    def __init__(self, api_url: str, root: Path) -> None:
        demo = build_app(api_url, None, labels=("shoe", "bag"), store_root=root)
        self.wired: dict[str, list[set[int]]] = {}
        found: NotesView | None = None
        for f in demo.fns.values():
            owner = getattr(f.fn, "__self__", None)
            if isinstance(owner, NotesView):
                found = owner
                self.wired.setdefault(f.fn.__name__, []).append({o._id for o in f.outputs})
        assert found is not None, "build_app wired no NotesView"
        self.ns = found
        self.triggers = {  # handler name -> (component id, event) pairs that set it off
            name: {t for f in demo.fns.values() if getattr(f.fn, "__name__", "") == name for t in f.targets}
            for name in ("on_show",)
        }
        assert isinstance(found.cb, ReviewerCallbacks)  # the handlers of the whole page, as build_app made them
        self.cb, self.c, self.n = found.cb, found.c, found.c.notes

    def call(self, name: str, *args: Any) -> dict[Any, Any]:
        """``NotesView.<name>(*args)``; its answer names only components its events were wired to update."""
        out: dict[Any, Any] = getattr(self.ns, name)(*args)
        for outputs in self.wired[name]:
            stray = [k for k in out if k._id not in outputs]
            assert not stray, f"{name} answered components it was not wired to: {stray}"
        return out


def reviewer(name: str) -> ReviewerState:
    return ReviewerState(token=TOKENS[name], signed_in=True)


def test_flag_unflag_and_the_flagged_only_queue(api_server: Any, tmp_path: Path) -> None:
    p = Page(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 61)
    st = reviewer("rev1")
    assert visible(p.cb.open_job(st, job)[p.c.review_col.style])
    out = p.call("on_show", st)
    assert visible(out[p.n.col.style]) and out[p.n.skip_btn]["interactive"] and out[p.n.flag_btn]["interactive"]
    assert not visible(out[p.n.unflag_btn]) and out[p.n.flag_md] == "" and out[p.n.comments_md] == ""

    out = p.call("on_flag", st, "   ")  # nothing typed: nothing sent
    assert out[p.n.error_md].startswith("Type why") and p.n.flag_reason not in out
    with HitlClient(api_server.url, TOKENS["rev2"]) as rev2:
        assert rev2.get_job(job).flag is None

        out = p.call("on_flag", st, "  the boxes cut the product in half  ")
        assert out[p.n.flag_reason] == "" and out[p.n.error_md] == "" and visible(out[p.n.unflag_btn])
        assert (
            "Flagged for a lead** by you" in out[p.n.flag_md]
            and "the boxes cut the product in half" in out[p.n.flag_md]
        )
        assert out[p.n.flag_btn]["value"] == "⚑ Flag again"
        snap = rev2.get_job(job)
        assert (
            snap.flag is not None and snap.flag.by == "rev1" and snap.flag.reason == "the boxes cut the product in half"
        )
        assert snap.active_pause is not None and st.panel is not None  # still waiting, the same review open
        assert snap.active_pause.pause_token == st.panel.pause_token and snap.version == st.version

        # The queue: "⚑ reason" in the stage cell; "Flagged only" lists the flagged jobs alone.
        rows = p.cb.on_tick(st)[p.c.queue_table].set_index("Job")
        assert rows.loc[job, "Stage"] == "Confirm boxes (round 1) · ⚑ the boxes cut the product in half"
        table = p.call("on_flagged_only", st, True)[p.c.queue_table]
        assert job in list(table["Job"]) and all("⚑" in s for s in table["Stage"])
        ticked = p.cb.on_tick(st)[p.c.queue_table]  # the same rows: the poll leaves the table as it is
        assert st.queue_flagged and (ticked == gr.skip() or list(ticked["Job"]) == list(table["Job"]))
        assert {j.job_id for j in rev2.flagged_jobs().jobs} >= {job}

        # Another reviewer who opens the job sees the flag on its panel.
        other = reviewer("rev2")
        p.cb.open_job(other, job)
        assert "by rev1" in p.call("on_show", other)[p.n.flag_md]

        out = p.call("on_unflag", st)
        assert out[p.n.flag_md] == "" and not visible(out[p.n.unflag_btn]) and "taken off" in out[p.c.banner_md]
        assert rev2.get_job(job).flag is None
        assert job not in list(p.call("on_flagged_only", st, True)[p.c.queue_table]["Job"])
        assert job in list(p.call("on_flagged_only", st, False)[p.c.queue_table]["Job"])
        actions = [(e["actor"], e["action"]) for e in rev2.audit(job)["entries"] if e["action"] in ("FLAG", "UNFLAG")]
        assert actions == [("rev1", "FLAG"), ("rev1", "UNFLAG")]
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:
        admin.cancel(job)


def test_a_comment_is_shown_to_the_next_reviewer_and_a_refusal_loses_nothing(api_server: Any, tmp_path: Path) -> None:
    p = Page(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 62)
    a, b = reviewer("rev1"), reviewer("rev2")
    p.cb.open_job(a, job)
    assert p.call("on_comment", a, " ")[p.n.error_md] == "Type a comment first."
    out = p.call("on_comment", a, "box 2 is a reflection, not a shoe")
    assert out[p.n.comment_text] == "" and out[p.n.error_md] == ""
    assert "**rev1**" in out[p.n.comments_md] and "box 2 is a reflection, not a shoe" in out[p.n.comments_md]
    assert "x" * 2001 not in str(p.call("on_comment", a, "x" * 2001))  # too long: said, not sent

    p.cb.release_claim(a)
    p.cb.open_job(b, job)  # the next reviewer opens the job: the comment is above the panel
    shown = p.call("on_show", b)[p.n.comments_md]
    assert shown.startswith("**Comments (1)**") and "**rev1**" in shown and "ago: box 2 is a reflection" in shown
    out = p.call("on_comment", b, "agreed — deleted it")
    assert out[p.n.comments_md].index("rev1") < out[p.n.comments_md].index("agreed")  # oldest first

    # 401 and 403: said in words, the typed text stays (the field is not in the answer).
    for token, words in (("tok-nobody", "(401)"), (TOKENS["sub1"], "(403)")):
        wrong = ReviewerState(token=token, signed_in=True)
        wrong.job_id, wrong.snapshot = b.job_id, b.snapshot
        out = p.call("on_comment", wrong, "kept")
        assert words in out[p.n.error_md] and p.n.comment_text not in out
        out = p.call("on_flag", wrong, "kept")
        assert words in out[p.n.error_md] and p.n.flag_reason not in out
    # 409 once the job has ended; the controls hide for an ended job.
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:
        admin.cancel(job)
    out = p.call("on_comment", b, "too late")
    assert "it has ended (JOB_CANCELLED)" in out[p.n.error_md] and p.n.comment_text not in out
    assert "it has ended" in p.call("on_flag", b, "too late")[p.n.error_md]
    p.cb.open_job(b, job)
    out = p.call("on_show", b)
    assert not visible(out[p.n.col.style]) and "agreed" in out[p.n.comments_md]  # the comments stay readable
    # 404: a job the control plane does not have.
    b.job_id = "job_doesnotexist0000000000"
    assert b.snapshot is not None
    b.snapshot = b.snapshot.model_copy(update={"job_id": b.job_id})
    assert "no such job (404)" in p.call("on_flag", b, "x")[p.n.error_md]


def test_skip_opens_the_next_job_as_n_does_and_n_passes_the_skipped_one_over(api_server: Any, tmp_path: Path) -> None:
    p = Page(api_server.url, tmp_path / "ui")
    jobs = [waiting_job(api_server.url, seed) for seed in (63, 64, 65)]
    st = reviewer("rev1")
    p.cb.open_job(st, jobs[0])
    assert st.claimed == jobs[0]
    out = p.call("on_skip", st)
    assert st.job_id not in (None, jobs[0]) and st.claimed == st.job_id  # the next job, claimed as N claims it
    assert out[p.c.annotator]["boxes"] and visible(out[p.c.review_col.style])  # drawn at once, as N draws it
    assert out[p.c.banner_md].startswith(f"Skipped {jobs[0]}") and out[p.n.error_md] == ""
    assert p.c.annotator not in p.cb.after_open(st)  # nothing left for the second step to draw
    with HitlClient(api_server.url, TOKENS["rev1"]) as rev1, HitlClient(api_server.url, TOKENS["rev2"]) as rev2:
        snap = rev1.get_job(jobs[0])
        assert snap.claim is None and snap.active_pause is not None  # handed back, still waiting
        mine = {j.job_id for j in rev1.list_jobs(status="WAITING", limit=200, unclaimed=True).jobs}
        theirs = {j.job_id for j in rev2.list_jobs(status="WAITING", limit=200, unclaimed=True).jobs}
        assert jobs[0] not in mine and jobs[0] in theirs  # passed over for rev1 only
        for _ in range(3):  # N, again and again: never the skipped job
            p.cb.on_next(st)
            assert st.job_id != jobs[0]
        assert [e["actor"] for e in rev1.audit(jobs[0])["entries"] if e["action"] == "SKIP"] == ["rev1"]

    # A job with no review waiting cannot be skipped: said in words, the job stays open.
    other = reviewer("rev2")
    p.cb.open_job(other, jobs[1])
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:
        admin.cancel(jobs[1])
    out = p.call("on_skip", other)
    assert "it has ended" in out[p.n.error_md] or "no review waits" in out[p.n.error_md]
    assert other.job_id == jobs[1]


def test_skip_with_nothing_else_waiting_closes_the_job(
    api_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When N finds nothing, the skipped job is closed: left on screen, the claim renewal would take it again."""
    p = Page(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 66)
    st = reviewer("rev2")
    p.cb.open_job(st, job)
    monkeypatch.setattr(p.cb, "on_next", lambda s: {p.c.banner_md: "No other job is waiting for review."})
    out = p.call("on_skip", st)
    assert st.job_id is None and st.claimed is None and not visible(out[p.c.review_col.style])
    assert out[p.c.current_job] == "" and out[p.c.job_md].startswith("No job open")
    assert out[p.c.banner_md] == (
        f"Skipped {job}: “Open next job” passes it over for 10 min. No other job is waiting for review."
    )
    assert not visible(p.call("on_show", st)[p.n.col.style])
    assert p.cb.on_tick(st).get(p.c.claim_md) is None  # nothing to renew
    with HitlClient(api_server.url, TOKENS["rev1"]) as rev1:
        assert rev1.get_job(job).claim is None
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:
        admin.cancel(job)
    with HitlClient(api_server.url, TOKENS["rev2"]) as rev2, pytest.raises(ConflictError):
        rev2.skip(job)


def test_a_colleagues_comment_and_flag_reach_the_open_page_without_a_redraw(api_server: Any, tmp_path: Path) -> None:
    """Notes change nothing of the job (no version): the follower tells them apart by their events, fetches
    the notes and sets ``notes_key`` (the notes' signature), whose change shows them again (``on_show``);
    the canvas is left alone."""
    p = Page(api_server.url, tmp_path / "ui")
    assert (p.c.notes_key._id, "change") in p.triggers["on_show"]
    job = waiting_job(api_server.url, 64)
    with HitlClient(api_server.url, TOKENS["rev2"]) as rev2:
        rev2.comment(job, "an earlier comment")  # on the page from its opening: not announced again
    b = reviewer("rev1")
    p.cb.open_job(b, job)
    opened = b.notes_signature()

    async def colleague_notes() -> list[dict[Any, Any]]:
        follower = p.cb.follow(b, None)  # type: ignore[arg-type]  # no gr.Request off a browser

        def note() -> None:
            with HitlClient(api_server.url, TOKENS["rev2"]) as rev2:
                rev2.comment(job, "box 1 is the box, not the shoe")
                rev2.flag(job, "odd product: ask the lead")

        async def later() -> None:
            await asyncio.sleep(1.0)  # the follower is reading the job's events by then
            await asyncio.to_thread(note)

        task = asyncio.create_task(later())
        try:
            return await updates(follower, until=lambda u: b.snapshot is not None and b.snapshot.flag is not None)
        finally:
            await task

    got = asyncio.run(colleague_notes())
    keys = [u[p.c.notes_key] for u in got if p.c.notes_key in u]
    # One new key per note arrived (the comment's fetch may already bring the flag); none for the earlier comment.
    assert 1 <= len(set(keys)) == len(keys) <= 2 and opened not in keys and "" not in keys
    assert keys[-1] == b.notes_signature()
    assert not any(p.c.annotator in u for u in got)  # the review on screen is not redrawn
    assert b.snapshot is not None and b.snapshot.flag is not None and b.snapshot.flag.by == "rev2"
    shown = p.call("on_show", b)
    assert "box 1 is the box, not the shoe" in shown[p.n.comments_md] and "an earlier comment" in shown[p.n.comments_md]
    assert "odd product: ask the lead" in shown[p.n.flag_md]


def test_the_notes_signature_moves_with_what_the_notes_show_and_nothing_else() -> None:
    """``notes_key`` carries ``ReviewerState.notes_signature``: the notes are drawn again (one event) when
    a job opens or closes, its pause is answered, it ends, or a flag or comment arrives; a status line
    moving on while the job is processed changes none of that, so it sets off nothing."""
    st = opened(round1())
    waiting = st.notes_signature()
    assert waiting and waiting == opened(round1().model_copy(update={"version": 9})).notes_signature()
    processing = snapshot(status="VALIDATING_MANUAL_BOXES", active=None, actions=[], version=4)
    st.snapshot = processing
    answered = st.notes_signature()
    assert answered != waiting
    st.snapshot = processing.model_copy(update={"status": "PROCESSING_APPROVED_SUBJECTS", "version": 5})
    assert st.notes_signature() == answered  # the status line moved on, the notes did not
    flag = JobFlag(by="rev2", reason="odd product", at="2026-05-21T10:01:00Z")
    st.snapshot = processing.model_copy(update={"flag": flag})
    flagged = st.notes_signature()
    assert flagged not in (answered, waiting)
    comment = JobComment(by="rev2", text="box 1", at="2026-05-21T10:02:00Z")
    st.snapshot = processing.model_copy(update={"flag": flag, "comments": [comment]})
    assert st.notes_signature() not in (flagged, answered)
    st.snapshot = processing.model_copy(update={"status": "SUCCEEDED", "version": 8})
    assert st.notes_signature() not in (answered, waiting)  # ended: the controls go
    st.job_id = None
    assert st.notes_signature() == ""  # no job open: the notes are hidden
