"""Skip, flag for a lead, and comments on the reviewer page (docs/protocol.md § Flags, skips and comments).

``NotesView`` holds the page's callbacks (``ui.mask_review_view.ReviewerCallbacks``) and adds the
handlers of the controls ``ui.notes_layout`` lays out; ``ui.notes_wiring`` connects them.

- **Skip** (key S) hands the open job back (``POST /jobs/{id}/skip``: the claim released, this
  reviewer's next job passes it over for ``SKIP_FOR_S``), then opens the next job exactly as
  "Open next job (N)" does (``Callbacks.on_next``). With nothing else waiting, the page closes the
  skipped job rather than keep it on screen (the claim renewal would claim it again).
- **Flag for a lead** (with a reason) and **Unflag**: the job stays waiting; the queue shows
  "⚑ reason" (``ui.queue``) and "Flagged only" lists the flagged jobs, for a lead.
- **Comments**: shown above the review panel whenever a job opens (the next reviewer reads them),
  with who wrote each and when; "Add comment" posts one.

None of them changes the job's version, so the open review is never disturbed; the notes shown are
those of the snapshot the page opened, refreshed after each of this reviewer's own notes and whenever
the job's events announce one (a colleague's flag or comment: the follower, ``ui.pump``). A refused
call (401, 403, 404, 409, 400) is said in words under the controls and what was typed stays.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import gradio as gr

from hitl_review.client import ApiError
from hitl_review.client.times import parse_time
from hitl_review.statecore.models import JobComment, JobFlag, JobSnapshot

from .callbacks import Callbacks, error_text
from .notes_layout import NotesComponents
from .panel import is_terminal
from .queue import format_age
from .session import ReviewerState

SKIP_FOR_S = 600.0  # how long N passes a skipped job over (the server's default too)
Update = dict[Any, Any]

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~])")


def md_text(text: str) -> str:
    """A reviewer's words shown as they were typed (no Markdown, no HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", text.strip())


def when_text(at: str | None, now: datetime | None = None) -> str:
    """How long ago an ISO-8601 time was ("3 min 05 s ago"); the text as given when it does not parse."""
    t = parse_time(at) if at else None
    if t is None:
        return at or "?"
    return f"{format_age(((now or datetime.now(UTC)) - t).total_seconds())} ago"


def flag_text(flag: JobFlag | None, me: str | None = None, now: datetime | None = None) -> str:
    """The open job's flag, above its panel: who, when and why."""
    if flag is None:
        return ""
    who = "you" if me and flag.by == me else md_text(flag.by)
    return f"⚑ **Flagged for a lead** by {who} ({when_text(flag.at, now)}): {md_text(flag.reason)}"


def comments_text(comments: list[JobComment], now: datetime | None = None) -> str:
    """The open job's comments, oldest first, each with its author and time."""
    if not comments:
        return ""
    lines = [f"**Comments ({len(comments)})**"]
    for c in comments:
        lines.append(f"- **{md_text(c.by)}** · {when_text(c.at, now)}: {md_text(c.text)}")
    return "\n".join(lines)


def note_error(exc: Exception, what: str) -> str:
    """A refused note in words (``what``: "flag", "skip", "comment on", "unflag")."""
    if isinstance(exc, ApiError):
        code = exc.code or ""
        if exc.status_code == 404:
            return f"Could not {what} this job: the control plane has no such job (404)."
        if exc.status_code == 409 and code == "PAUSE_NOT_ACTIVE":
            return f"Could not {what} this job: no review waits on it now (it is in model work or was decided)."
        if exc.status_code == 409 and code in ("JOB_CANCELLED", "JOB_TERMINAL"):
            return f"Could not {what} this job: it has ended ({code})."
        if exc.status_code == 400:
            return f"Could not {what} this job: {exc.message} ({code})."
    return f"Could not {what} this job: " + error_text(exc)


class NotesView:
    """The handlers of the skip, flag and comment controls, over the page's callbacks ``cb``."""

    def __init__(self, cb: Callbacks) -> None:
        self.cb = cb
        self.c = cb.c
        self.n: NotesComponents = cb.c.notes

    # ------------------------------------------------------------------ showing

    def notes_view(self, st: ReviewerState, *, error: str | None = "") -> Update:
        """The open job's flag and comments, and the controls that apply to it."""
        n = self.n
        with st.lock:
            snap = st.snapshot if st.job_id and st.snapshot is not None and st.snapshot.job_id == st.job_id else None
            me = st.reviewer
        live = snap is not None and not is_terminal(snap)
        waiting = live and snap is not None and snap.active_pause is not None
        flagged = snap is not None and snap.flag is not None
        out: Update = {
            n.flag_md: flag_text(snap.flag, me) if snap is not None else "",
            n.comments_md: comments_text(snap.comments) if snap is not None else "",
            **n.col.update(live),
            # with their text: a button shown again after an update without it comes back blank
            n.skip_btn: gr.update(interactive=waiting, value=n.skip_btn.value),
            n.flag_btn: gr.update(interactive=waiting, value="⚑ Flag again" if flagged else "⚑ Flag"),
            n.unflag_btn: gr.update(visible=waiting and flagged, value=n.unflag_btn.value),
            n.comment_btn: gr.update(interactive=live, value=n.comment_btn.value),
        }
        if error is not None:
            out[n.error_md] = error
        return out

    def on_show(self, st: ReviewerState) -> Update:
        """A job was opened or drawn (or closed): its notes as the snapshot just fetched has them."""
        return self.notes_view(st)

    def _refreshed(self, st: ReviewerState, job_id: str, snap: JobSnapshot | None = None) -> None:
        """The notes of ``job_id`` fetched again (a colleague's too), kept in the open snapshot."""
        try:
            snap = snap or self.cb.clients.get(st.token).get_job(job_id)
        except Exception:  # the notes shown stay as they were; the next open fetches them
            return
        with st.lock:
            if st.snapshot is not None and st.job_id == job_id == st.snapshot.job_id:
                st.snapshot = st.snapshot.model_copy(update={"flag": snap.flag, "comments": snap.comments})

    def _job(self, st: ReviewerState) -> str | None:
        with st.lock:
            return st.job_id if st.snapshot is not None else None

    # ------------------------------------------------------------------ the queue's filter

    def on_flagged_only(self, st: ReviewerState, flagged: bool | None) -> Update:
        """The "Flagged only" filter: the queue lists the jobs flagged for a lead."""
        st.queue_flagged = bool(flagged)
        if not st.signed_in:
            return {self.c.queue_note: gr.skip()}
        return self.cb.queue_update(st)

    # ------------------------------------------------------------------ skip

    def on_skip(self, st: ReviewerState) -> Update:
        """Hand the open job back, then open the next one as N does (``Callbacks.on_next``)."""
        job = self._job(st)
        if not job or not st.signed_in:
            return {self.n.error_md: "No job is open to skip."}
        try:
            self.cb.clients.get(st.token).skip(job, SKIP_FOR_S)
        except Exception as exc:  # said under the controls; the job stays open and claimed
            return {self.n.error_md: note_error(exc, "skip")}
        with st.lock:
            if st.claimed == job:
                st.claimed = None  # the skip released it
        out = self.cb.on_next(st)
        told = f"Skipped {job}: “Open next job” passes it over for {int(SKIP_FOR_S // 60)} min."
        if self.c.annotator in out:  # the next job opened, drawn in the same update
            st.notice = told
            out[self.c.banner_md] = told
            out[self.n.error_md] = ""
            return out
        # Nothing else to open: close the skipped job (kept on screen, the claim renewal would take it again).
        said = out.get(self.c.banner_md)
        with st.lock:
            if st.job_id == job:
                st.job_id, st.snapshot, st.panel, st.mask_review = None, None, None, None
                st.follow_gen += 1  # its follower stops
            out = self.cb.view(st, banner=f"{told} {said if isinstance(said, str) else ''}".strip(), error="")
        out[self.n.error_md] = ""
        return out

    # ------------------------------------------------------------------ flag

    def on_flag(self, st: ReviewerState, reason: str | None) -> Update:
        """Flag the open job for a lead, with why; it stays waiting."""
        job, why = self._job(st), (reason or "").strip()
        if not job:
            return {self.n.error_md: "No job is open to flag."}
        if not why:
            return {self.n.error_md: "Type why a lead should look at this job, then press Flag."}
        try:
            flag = self.cb.clients.get(st.token).flag(job, why[:500])
        except Exception as exc:  # said under the controls; the reason typed stays in its field
            return {self.n.error_md: note_error(exc, "flag")}
        self._refreshed(st, job)
        with st.lock:
            if st.snapshot is not None and st.job_id == job and st.snapshot.flag != flag:
                st.snapshot = st.snapshot.model_copy(update={"flag": flag})  # the GET failed: the answer itself
        out = self.notes_view(st)
        out[self.n.flag_reason] = ""
        out[self.c.banner_md] = "Flagged for a lead; the job stays in the queue."
        return out

    def on_unflag(self, st: ReviewerState) -> Update:
        job = self._job(st)
        if not job:
            return {self.n.error_md: "No job is open."}
        try:
            removed = self.cb.clients.get(st.token).unflag(job)
        except Exception as exc:  # said under the controls
            return {self.n.error_md: note_error(exc, "unflag")}
        self._refreshed(st, job)
        with st.lock:
            if st.snapshot is not None and st.job_id == job and st.snapshot.flag is not None:
                st.snapshot = st.snapshot.model_copy(update={"flag": None})
        out = self.notes_view(st)
        out[self.c.banner_md] = "The flag was taken off." if removed else "The job had no flag."
        return out

    # ------------------------------------------------------------------ comments

    def on_comment(self, st: ReviewerState, text: str | None) -> Update:
        """Post a comment on the open job, for the next reviewer."""
        job, said = self._job(st), (text or "").strip()
        if not job:
            return {self.n.error_md: "No job is open to comment on."}
        if not said:
            return {self.n.error_md: "Type a comment first."}
        if len(said) > 2000:
            return {self.n.error_md: f"A comment has at most 2000 characters (this one has {len(said)})."}
        try:
            posted = self.cb.clients.get(st.token).comment(job, said)
        except Exception as exc:  # said under the controls; the comment typed stays in its field
            return {self.n.error_md: note_error(exc, "comment on")}
        self._refreshed(st, job)
        with st.lock:
            snap = st.snapshot
            if snap is not None and st.job_id == job and posted not in snap.comments:
                st.snapshot = snap.model_copy(update={"comments": [*snap.comments, posted][-50:]})
        out = self.notes_view(st)
        out[self.n.comment_text] = ""
        return out
