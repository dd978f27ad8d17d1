"""Claims and presence on the reviewer page (docs/protocol.md § Claims).

A mixin of ``ui.callbacks.Callbacks``. Opening a waiting job claims it; the page's timer renews the
claim every ``CLAIM_RENEW_S`` while the panel is open; opening another job (or closing the tab)
releases it. Another reviewer's live claim shows who and for how long, with a "Take over" button
(``force``); a renewal refused with ``CLAIMED_BY_OTHER`` means someone took the job over: the page
says so and turns Submit off (the unsent edits stay in the browser's draft). "Next job" claims the
oldest job nobody else claimed in one request (``POST /claims/next``): the server passes over a job
another reviewer got first.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

import gradio as gr

from hitl_review.client import ApiError, ConflictError, HitlClient
from hitl_review.statecore.models import ClaimedJob, ClaimView, JobSnapshot

from .layout import Components
from .queue import claim_left_s
from .session import ReviewerState

CLAIM_RENEW_S = 5.0  # well inside the server's claim TTL (60 s by default)
UNSEEN_REDRAW_S = 3.0  # the page shows another job than the session's open one this long: drawn again

Update = dict[Any, Any]


class _Clients(Protocol):
    def get(self, token: str | None) -> HitlClient: ...


def claim_text(st: ReviewerState) -> str:
    """The presence line above the panel."""
    holder = st.held_by
    if holder is not None:
        left = int(claim_left_s(holder))
        if st.taken_over:
            return (
                f"**{holder.reviewer} took this job over** — you can no longer submit here; your unsent edits "
                "are kept in this browser. Press “Take over” to take it back."
            )
        if left <= 0:
            return f"**{holder.reviewer}'s claim has expired** — press “Take over” to review this job."
        return f"**{holder.reviewer} is reviewing — {left} s left** on their claim. “Take over” to review it anyway."
    if st.reviewing and st.claimed == st.job_id:
        return "You are reviewing this job; other reviewers see it as taken."
    return ""


class ClaimHandlers:
    """Claiming, renewing, releasing and taking over; ``Callbacks`` provides ``c`` and ``clients``."""

    c: Components
    clients: _Clients
    redraws: int
    _session_claims: dict[str, tuple[str | None, str]]
    _claims_lock: threading.Lock

    def claim_job(self, st: ReviewerState, job_id: str, *, force: bool = False) -> ClaimView | None:
        """Claim (or renew) ``job_id``; the other reviewer's claim when theirs is in the way (409)."""
        return self.claim_fresh(st, job_id, force=force)[0]

    def claim_fresh(
        self, st: ReviewerState, job_id: str, *, force: bool = False, snapshot: bool = False
    ) -> tuple[ClaimView | None, JobSnapshot | None]:
        """``claim_job``, and with ``snapshot`` the job's snapshot read right after the claim, in the same
        round trip (``POST …/claim?snapshot=true``, docs/protocol.md § Claims): the fresh state to open."""
        try:
            client = self.clients.get(st.token)
            claim = client.claim(job_id, force=force, snapshot=True) if snapshot else client.claim(job_id, force=force)
        except ConflictError as exc:
            if exc.code == "CLAIMED_BY_OTHER" and exc.claim is not None:
                return exc.claim, None
            raise
        self._hold(st, job_id, claim.reviewer)
        return None, claim.snapshot if isinstance(claim, ClaimedJob) else None

    def claim_next(self, st: ReviewerState) -> ClaimedJob | None:
        """N: claim the next job (other than the one on the page) with its snapshot, then release the claim
        on the job left; None, and the claim on the page's job kept, when no other job is left to claim."""
        left = st.claimed
        taken = self.clients.get(st.token).claim_next(exclude=[st.job_id] if st.job_id else [])
        if taken is None:
            return None
        job_id = taken.snapshot.job_id
        self._hold(st, job_id, taken.reviewer)
        if left and left != job_id:  # the job left is free for others (nothing is held after a submission)
            self._release(st, left)
        return taken

    def _hold(self, st: ReviewerState, job_id: str, reviewer: str) -> None:
        with st.lock:
            st.reviewer, st.claimed, st.renewed_at = reviewer, job_id, time.monotonic()
            st.held_by, st.taken_over = None, False

    def release_claim(self, st: ReviewerState, keep: str | None = None) -> None:
        """Release the claim this session holds, unless it is on ``keep`` (best effort: it expires anyway)."""
        old = st.claimed
        if not old or old == keep:
            return
        st.claimed = None
        self._release(st, old)

    def _release(self, st: ReviewerState, job_id: str) -> None:
        try:
            self.clients.get(st.token).release(job_id)
        except Exception:  # not ours any more, or the server is away: the claim expires by itself
            pass

    def claim_on_open(self, st: ReviewerState, job_id: str, waiting: bool) -> ClaimView | None:
        """Leaving the job on screen for ``job_id``: release the old claim, claim the new job when it waits."""
        self.release_claim(st, keep=job_id)
        if not waiting:
            return None
        try:
            return self.claim_job(st, job_id)
        except ApiError:  # e.g. the pause was consumed in between: the panel shows what it is
            return None

    def remember_session(self, st: ReviewerState, request: gr.Request | None) -> None:
        """Which claim a browser session holds, so that closing its tab releases it (``on_unload``)."""
        session = getattr(request, "session_hash", None) if request is not None else None
        if not session:
            return
        with self._claims_lock:
            if st.claimed:
                self._session_claims[session] = (st.token, st.claimed)
            else:
                self._session_claims.pop(session, None)

    def release_session(self, session: str | None) -> None:
        with self._claims_lock:
            held = self._session_claims.pop(session or "", None)
        if held is not None:
            token, job_id = held
            try:
                self.clients.get(token).release(job_id)
            except Exception:  # expires by itself
                pass

    def presence_update(self, st: ReviewerState) -> Update:
        c = self.c
        waiting = st.reviewing  # a box panel or a mask review (ui.mask_review_view)
        free = st.held_by is None
        # The panel stays laid out (a canvas laid out hidden has no size); its submit buttons are off.
        return {
            c.claim_md: claim_text(st),
            c.takeover_btn: gr.update(visible=waiting and not free, value=c.takeover_btn.value),
            # shown or hidden by their class, never unmounted (ui.layout)
            **c.review_col.update(st.panel is not None),
            **c.canvas_col.update(st.panel is not None),
            c.submit_btn: gr.update(interactive=free, value=c.submit_btn.value),
            c.cut_btn: gr.update(interactive=free, value=c.cut_btn.value),
        }

    def renew(self, st: ReviewerState) -> Update:
        """The timer's part: renew this session's claim while its panel is open; notice a takeover."""
        with st.lock:
            job = st.job_id
            due = time.monotonic() - st.renewed_at >= CLAIM_RENEW_S
            if not job or not st.reviewing:
                return {}
            if st.held_by is not None or not due:
                return {self.c.claim_md: claim_text(st)}  # the other's countdown
            had = st.claimed == job
        try:
            holder = self.claim_job(st, job)
        except Exception:  # the job moved on, or the server is away: the next tick tries again
            return {}
        if holder is None:
            return {self.c.claim_md: claim_text(st)}
        with st.lock:
            st.held_by, st.taken_over, st.claimed = holder, had, None
            st.notice = (
                f"{holder.reviewer} took this job over: stop editing here."
                if had
                else f"{holder.reviewer} is reviewing this job."
            )
            out = self.presence_update(st)
            out[self.c.banner_md] = st.notice
        return out

    def converge(self, st: ReviewerState, page_job: str | None, page_pause: str | None = None) -> Update:
        """The timer's check that the page shows the job this session has open (``page_job``: the job the
        page's last view named, ``current_job``). An update of the job left that lands after the next
        job's panel would leave the page on the old one while the session holds, and the timer renews, a
        claim on the new one: a job nobody else is offered and its reviewer does not see (the
        four-reviewer benchmark stranded one this way, docs/benchmarks.md). The same within a job
        (``page_pause``, the pause whose panel the page's last view showed, "" for none): the update
        that closed a submitted round, landing after the follower's panel of the round the validator
        opened next, hid that panel under "round 2 is open below" (a CI run saw it). When the page has
        shown another job or pause for ``UNSEEN_REDRAW_S`` under the same opening (an opening's own
        update is on its way for far less), the panel is drawn again, by the event a 409's redraw uses."""
        with st.lock:
            job = st.job_id
            pause = st.panel.pause_token if st.panel is not None else ""
            same = page_job == job and (page_pause is None or page_pause == pause)
            if page_job is None or not job or same or st.emitting or st.sending:
                st.unseen = None
                return {}
            now = time.monotonic()
            if st.unseen is None or st.unseen[:2] != (job, st.follow_gen):
                st.unseen = (job, st.follow_gen, now)
                return {}
            if now - st.unseen[2] < UNSEEN_REDRAW_S:
                return {}
            st.unseen = None
            st.conflict_view = (True, None)  # drawn by ``on_conflict_view``, as a 409's redraw is
            self.redraws += 1
            return {self.c.redraw_key: f"{job}|unseen|{self.redraws}"}

    def on_take_over(self, st: ReviewerState) -> Update:
        """The "Take over" button: claim the open job with ``force`` (audited by the server)."""
        job = st.job_id
        if not job:
            return {self.c.banner_md: gr.skip()}
        try:
            self.claim_job(st, job, force=True)
            snap = self.clients.get(st.token).get_job(job)
        except Exception as exc:  # said in the banner; the button stays
            return {self.c.banner_md: f"Could not take the job over: {exc}"}
        st.apply_snapshot(snap)
        st.notice = "You took this job over; the other reviewer is told."
        # The canvas is drawn again from the job as it is now (``after_take_over``, the next step).
        out = self.presence_update(st)
        out.update({self.c.annotator: None, self.c.banner_md: st.notice})
        st.undrawn = True
        return out

    def after_take_over(self, st: ReviewerState) -> Update:
        raise NotImplementedError  # Callbacks: redraw the panel (``after_open``)
