"""The mask-review panel on the reviewer page (docs/protocol.md § Cut-out quality, SPEC §13).

``ReviewerCallbacks`` is the page's set of handlers: the box stages' (``ui.callbacks.Callbacks``) and,
here, the mask review's. While the open job waits in ``WAITING_MASK_REVIEW`` the page shows, instead
of the box editor, one subject at a time: its mask over the image, its cut-out on a checkerboard, the
gate's reasons in words and the list of subjects with the decision so far. Accept, Reject (with a
reason) or Refine (points clicked on the image, each click previewed through the preview route);
Submit sends every decision at once. The page claims the job as for a box stage (``ui.claims``);
a 409 redraws the panel from the snapshot it carries and keeps the decisions that still apply
(``ui.mask_review.carry_over``), and the browser keeps the unsent decisions per job and pause
(``draft_message``), as the box editor keeps its edits. Why a plain image and a script take the
clicks: ``ui.mask_layout``.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image

from hitl_review.client import ApiError, ConflictError, RateLimitedError, new_intervention_id
from hitl_review.statecore.models import JobSnapshot, QualityVerdict
from hitl_review.statecore.states import JobStatus

from .callbacks import Callbacks, error_text
from .mask_layout import MaskComponents
from .mask_render import clicks_from, cutout_view, load, picture_name, picture_of, subject_view, window_for
from .mask_review import (
    KINDS,
    DecisionKind,
    MaskReview,
    MaskSubject,
    Preview,
    carried_text,
    carry_over,
    conflict_text,
    draft_message,
    mask_panel_from_snapshot,
    restore_draft,
    stage_md,
    subject_choices,
    subject_md,
    submitted_text,
    summary_md,
)
from .panel import panel_from_snapshot
from .results import ResultsView, write_atomic
from .session import ReviewerState, conflict_banner

Update = dict[Any, Any]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[-120:] or "artifact"


class ReviewerCallbacks(Callbacks):
    """Every handler of the page: the box stages' and the mask review's (``ui.app.wire`` connects them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mask_draws = 0  # drawings of a mask review: each gives the browser a new key to look up a draft

    @property
    def m(self) -> MaskComponents:
        return self.c.mask

    # ------------------------------------------------------------------ which review is open

    def sync_mask(self, st: ReviewerState) -> MaskReview | None:
        """The mask review of the job's snapshot now: the one open when the pause is the same, a new one
        (with the decisions that still apply from the one it replaces) when it changed, None when none."""
        with st.lock:
            snap = st.snapshot
            panel = mask_panel_from_snapshot(snap) if snap is not None and snap.job_id == st.job_id else None
            if panel is not None and panel.pause_token in st.results:
                panel = None  # answered here (a quorum vote waits for others): it stays closed
            old = st.mask_review if isinstance(st.mask_review, MaskReview) else None
            if old is not None and old.panel.job_id != st.job_id:
                old = None
            if panel is None:
                st.mask_review = None
                return None
            if old is not None and old.panel.pause_token == panel.pause_token:
                return old
            if old is not None:
                review, kept, dropped = carry_over(old, panel)
                review.told = carried_text(kept, dropped)
            else:
                review = MaskReview(panel)
                n = len(panel.subjects)
                review.told = f"{n} cut-out{'s' if n != 1 else ''} wait{'s' if n == 1 else ''} for your decision."
            st.mask_review = review
            st.intervention_id = None  # a new pause: a new submission
            return review

    def _synced(self, st: ReviewerState, banner: str | None) -> tuple[MaskReview | None, str | None]:
        """``sync_mask``, and the banner saying so when another reviewer answered the review open here."""
        with st.lock:
            before = self._open_review(st)
            review = self.sync_mask(st)
            snap = st.snapshot
            if before is None or review is not None or before.panel.pause_token in st.results or snap is None:
                return review, banner
            if snap.status == JobStatus.CANCELLED or snap.job_id != before.panel.job_id:
                return review, banner  # a cancel says so itself; another job is none of this review's
            st.notice = f"Another reviewer submitted the decisions on these cut-outs first. {banner or ''}".strip()
            return review, st.notice

    # ------------------------------------------------------------------ files

    def _mask_dir(self, job_id: str) -> Path:
        return self.store.image_dir.parent / "masks" / job_id

    def _artifact(self, st: ReviewerState, url: str | None) -> bytes | None:
        """An artifact of the open job (a mask, a cut-out), downloaded once."""
        if not url or st.job_id is None:
            return None
        path = self._mask_dir(st.job_id) / _safe(url.rsplit("/", 1)[-1])
        if path.exists():
            return path.read_bytes()
        data = self.clients.get(st.token).download(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        return data

    def _fetch(self, st: ReviewerState, subject: MaskSubject | None) -> str | None:
        """The image and ``subject``'s mask and cut-out here; what failed, in words (None: all is here)."""
        if subject is None:
            return None
        try:
            self.store.ensure(st, self.clients.get(st.token))
            self._artifact(st, subject.mask_url)
            self._artifact(st, subject.cutout_url)
        except Exception as exc:  # said in the panel; the next move tries again
            return "Could not fetch the cut-out: " + error_text(exc)
        return None

    def _current(self, st: ReviewerState) -> MaskSubject | None:
        with st.lock:
            review = st.mask_review
            return review.subject if isinstance(review, MaskReview) else None

    # ------------------------------------------------------------------ drawing

    def refresh_view(
        self, st: ReviewerState, *, redraw: bool, banner: str | None = None, error: str | None = None
    ) -> Update:
        review, banner = self._synced(st, banner)
        if review is not None:
            problem = self._fetch(st, self._current(st))
            if problem:
                banner = ((banner + " ") if banner else "") + problem
        return super().refresh_view(st, redraw=redraw, banner=banner, error=error)

    def view(
        self,
        st: ReviewerState,
        *,
        redraw: bool = False,
        banner: str | None = None,
        error: str | None = None,
        results: ResultsView | None = None,
    ) -> Update:
        with st.lock:
            review, told = self._synced(st, banner)
            out = super().view(st, redraw=redraw, banner=told, error=error, results=results)
            out.update(self.mask_view(st, redraw=redraw))
            if review is not None:
                out[self.c.stage_md] = stage_md(review.panel)
                if review.told:
                    head = banner if banner is not None else (st.notice or "")
                    st.notice = f"{head} {review.told}".strip()
                    review.told = ""
                    out[self.c.banner_md] = st.notice
        return out

    def presence_update(self, st: ReviewerState) -> Update:
        out = super().presence_update(st)
        out[self.m.submit_btn] = self._submit_update(st)
        return out

    def _submit_update(self, st: ReviewerState) -> Any:
        review = st.mask_review
        ready = isinstance(review, MaskReview) and review.complete and st.held_by is None
        return gr.update(interactive=ready, value=self.m.submit_btn.value)

    def mask_view(self, st: ReviewerState, *, redraw: bool = False) -> Update:
        """The panel for ``st.mask_review``: drawn whole when new (or ``redraw``), else only shown."""
        review = st.mask_review
        if not isinstance(review, MaskReview):
            return self.m.col.update(False)
        out: Update = self.m.col.update(True)
        if redraw or not review.drawn:
            review.drawn = True
            self.mask_draws += 1  # a new key each time: the browser looks for this review's draft
            out[self.m.key] = f"{review.panel.job_id}|{review.panel.pause_token}|{self.mask_draws}"
            out[self.m.error_md] = ""
            out.update(self.subject_view(st, review))
        return out

    def subject_view(self, st: ReviewerState, review: MaskReview) -> Update:
        """The subject shown and everything about it: the pictures, the words, the decision buttons."""
        m, s, d = self.m, review.subject, review.decision()
        preview = review.preview() if d.kind == "REFINE" else None
        out: Update = {
            m.subject_md: subject_md(review),
            m.subjects: gr.update(choices=subject_choices(review), value=s.box_id),
            m.reason: d.reason,
            m.summary_md: summary_md(review),
            m.submit_btn: self._submit_update(st),
        }
        for kind, btn in zip(KINDS, (m.accept_btn, m.reject_btn, m.refine_btn), strict=True):
            out[btn] = gr.update(variant="primary" if d.kind == kind else "secondary", value=btn.value)
        try:
            image = Image.open(st.image_path).convert("RGB") if st.image_path else None
            raw_mask = self._artifact(st, s.mask_url)
            raw_cut = self._artifact(st, s.cutout_url)
        except Exception as exc:  # shown in the panel; the pictures stay as they were
            out[m.error_md] = "Could not show the cut-out: " + error_text(exc)
            return out
        if image is None:
            return out
        mask = load(preview.mask_png) if preview is not None else (load(raw_mask) if raw_mask else None)
        points = d.points if d.kind == "REFINE" else []
        window = window_for(s.bbox, image.width, image.height)
        folder = self._mask_dir(review.panel.job_id)
        folder.mkdir(parents=True, exist_ok=True)
        stem = picture_name(review.panel.pause_token, s.box_id, review.tag)
        out[m.image] = write_atomic(folder / f"{stem}_view.png", subject_view(image, mask, s.bbox, points, window))
        if preview is not None:
            cut = cutout_view(image, mask, None, s.bbox)
        else:
            cut = cutout_view(image, mask, load(raw_cut) if raw_cut else None, s.bbox)
        out[m.cutout] = write_atomic(folder / f"{stem}_cutout.png", cut) if cut is not None else None
        return out

    def _redrawn(self, st: ReviewerState, review: MaskReview, *, error: str = "", draft: bool = True) -> Update:
        """After a move of the reviewer: the subject drawn again, the error line, the draft to keep."""
        with st.lock:
            out = self.subject_view(st, review)
            out.setdefault(self.m.error_md, error)
            if draft:
                out[self.c.draft_out] = draft_message(review, review.panel)
        return out

    def _open_review(self, st: ReviewerState) -> MaskReview | None:
        review = st.mask_review
        return review if isinstance(review, MaskReview) else None

    # ------------------------------------------------------------------ deciding

    def _decide(self, st: ReviewerState, kind: DecisionKind, reason: str | None = None) -> Update:
        with st.lock:
            review = self._open_review(st)
            if review is None:
                return {self.m.error_md: gr.skip()}
            shown = review.subject.box_id
            d = review.decide(kind, reason)
            if d.problem() is None and kind != "REFINE":
                review.next_undecided()
            nxt = review.subject
        problem = self._fetch(st, nxt)
        if kind == "REFINE" and d.points and review.preview() is None:
            problem = problem or self._preview(st, review)
        out = self._redrawn(st, review, error=problem or "")
        if nxt.box_id == shown:
            # The same subject stays: the reason field is the reviewer's (R focuses it and they type at
            # once); writing the decision's reason back would wipe what they typed while this answer was
            # on its way (a rehearsal under load lost a reason that way).
            out[self.m.reason] = gr.skip()
        return out

    def on_mask_accept(self, st: ReviewerState) -> Update:
        return self._decide(st, "ACCEPT")

    def on_mask_reject(self, st: ReviewerState, reason: str | None) -> Update:
        return self._decide(st, "REJECT", reason if (reason or "").strip() else None)

    def on_mask_refine(self, st: ReviewerState) -> Update:
        return self._decide(st, "REFINE")

    def on_mask_reason(self, st: ReviewerState, reason: str | None) -> Update:
        """Typing in the reason field: kept for the subject shown (nothing else is redrawn)."""
        with st.lock:
            review = self._open_review(st)
            if review is None:
                return {self.m.error_md: gr.skip()}
            review.decision().reason = (reason or "").strip()[:500]
            return {
                self.m.subjects: gr.update(choices=subject_choices(review), value=review.subject.box_id),
                self.m.summary_md: summary_md(review),
                self.m.submit_btn: self._submit_update(st),
                self.c.draft_out: draft_message(review, review.panel),
            }

    def on_mask_reason_enter(self, st: ReviewerState, reason: str | None) -> Update:
        """Enter in the reason field: reject the subject shown with that reason."""
        if not (reason or "").strip():
            return {self.m.error_md: "Type why the cut-out is rejected, then press Enter."}
        return self._decide(st, "REJECT", reason)

    def _move(self, st: ReviewerState, step: int | None = None, box_id: str | None = None) -> Update:
        with st.lock:
            review = self._open_review(st)
            if review is None:
                return {self.m.error_md: gr.skip()}
            if box_id is not None:
                review.show(box_id)
            elif step is not None:
                review.go(step)
            nxt = review.subject
        return self._redrawn(st, review, error=self._fetch(st, nxt) or "", draft=False)

    def on_mask_next(self, st: ReviewerState) -> Update:
        return self._move(st, 1)

    def on_mask_prev(self, st: ReviewerState) -> Update:
        return self._move(st, -1)

    def on_mask_pick(self, st: ReviewerState, box_id: str | None) -> Update:
        return self._move(st, box_id=box_id or None)

    # ------------------------------------------------------------------ points and previews

    def on_mask_points(self, st: ReviewerState, raw: str | None) -> Update:
        """Clicks on the picture (``ui.mask_assets``): points of the subject shown, then its preview."""
        clicks = clicks_from(raw)
        with st.lock:
            review = self._open_review(st)
            if review is None or not clicks:
                return {self.m.error_md: gr.skip()}
            s = review.subject
            if review.decision().kind != "REFINE":
                return {self.m.error_md: "Press Refine (F) first, then click the image to add points."}
            image = review.panel.image
            window = window_for(s.bbox, image.width, image.height)
            problem, added = "", 0
            for click in clicks:
                if picture_of(click["src"]) != (review.panel.pause_token, s.box_id):
                    continue  # a click on the picture of another subject or pause: the view moved on
                x, y = window.to_image(click["x"], click["y"])
                problem = review.add_point(x, y, click["positive"]) or problem
                added += 0 if problem else 1
            if not added:
                return {self.m.error_md: problem or gr.skip()}
        return self._redrawn(st, review, error=self._preview(st, review) or problem)

    def on_mask_undo_point(self, st: ReviewerState) -> Update:
        return self._points(st, lambda r: r.undo_point())

    def on_mask_clear_points(self, st: ReviewerState) -> Update:
        return self._points(st, lambda r: bool(r.clear_points() or True))

    def _points(self, st: ReviewerState, change: Any) -> Update:
        with st.lock:
            review = self._open_review(st)
            if review is None or not change(review):
                return {self.m.error_md: gr.skip()}
            again = bool(review.decision().points) and review.preview() is None
        return self._redrawn(st, review, error=(self._preview(st, review) or "") if again else "")

    def _preview(self, st: ReviewerState, review: MaskReview) -> str | None:
        """Ask the preview route for the subject shown and its points; kept in ``review``. What went
        wrong, in words (the points stay either way: they are what Refine sends)."""
        with st.lock:
            s = review.subject
            points = tuple(review.decision().points)
        if not points:
            return None
        try:
            answer = self.clients.get(st.token).preview(review.panel.job_id, s.box_id, [p.to_json() for p in points])
            quality = answer.get("quality")
            preview = Preview(
                box_id=s.box_id,
                points=points,
                mask_png=base64.b64decode(answer["mask_png_base64"]),
                area=int(answer.get("area") or 0),
                quality=QualityVerdict.model_validate(quality) if quality else None,
                ms=float(answer["ms"]) if answer.get("ms") is not None else None,
            )
        except RateLimitedError:
            return "Too many previews at once: your point is kept; click again in a moment for its preview."
        except ApiError as exc:
            if exc.status_code == 503:
                return f"No preview here ({exc.message}); your points are kept and Refine sends them."
            return "The preview was refused: " + error_text(exc)
        except Exception as exc:  # the points stay; the next click asks again
            return "No preview: " + error_text(exc)
        with st.lock:
            review.keep_preview(preview)
        return None

    # ------------------------------------------------------------------ drafts kept by the browser

    def on_mask_restore_draft(self, st: ReviewerState, raw: str | None) -> Update:
        """The decisions this browser kept for the review just drawn (a reload, a crashed tab)."""
        with st.lock:
            review = self._open_review(st)
            if review is None or any(d.kind or d.points for d in review.decisions.values()):
                return {self.m.error_md: gr.skip()}
            restored = restore_draft(raw, review.panel)
            if restored is None:
                return {self.m.error_md: gr.skip()}
            new, kept, dropped = restored
            new.drawn, new.tag = True, review.tag
            st.mask_review = new
            st.notice = " ".join(p for p in (st.notice or "", carried_text(kept, dropped, restored=True)) if p)
            nxt = new.subject
        problem = self._fetch(st, nxt)
        if new.decision().kind == "REFINE" and new.decision().points:
            problem = problem or self._preview(st, new)
        out = self._redrawn(st, new, error=problem or "", draft=False)
        out[self.c.banner_md] = st.notice
        return out

    # ------------------------------------------------------------------ submitting

    def on_mask_submit(self, st: ReviewerState) -> Update:
        """Send every decision at once (docs/protocol.md § Cut-out quality)."""
        with st.lock:
            review = self._open_review(st)
            if st.held_by is not None and review is not None:
                return {self.m.error_md: f"{st.held_by.reviewer} has this job: press “Take over” to submit."}
            if review is None or review.panel.pause_token in st.results:
                return {
                    self.m.error_md: "",
                    self.c.banner_md: st.notice or "Nothing is waiting for review on this job.",
                }
            if not review.complete:
                return {self.m.error_md: "Not yet: " + "; ".join(review.problems()) + "."}
            panel, decisions, counts = review.panel, review.payload(), review.counts()
            iv = st.submission_id()
        try:
            res = self.clients.get(st.token).decide_masks(
                panel.job_id,
                intervention_id=iv,
                pause_token=panel.pause_token,
                base_version=panel.base_version,
                decisions=decisions,
                snapshot_id=panel.snapshot_id,
            )
        except ApiError as exc:
            if exc.status_code == 409:
                return self._refused(st, exc, review)
            return {self.m.error_md: f"The server refused the decisions: {exc.message} ({exc.code})."}
        except Exception as exc:  # the same intervention id is kept for the retry
            return {
                self.m.error_md: error_text(exc) + " Press Submit again: it resends the same decisions "
                "(same id), so they cannot count twice."
            }
        with st.lock:
            msg = st.results.get(panel.pause_token) or submitted_text(
                counts, res.status, res.next_node_type, res.quorum.model_dump() if res.quorum else None
            )
            st.results[panel.pause_token] = msg
            st.notice, st.intervention_id, st.claimed = msg, None, None  # submitting ends the claim
            snap = st.snapshot
            if snap is not None and res.version > snap.version:
                update = {"status": JobStatus(res.status), "version": res.version, "active_pause": None}
                st.snapshot = snap.model_copy(update={**update, "pending_actions": []})
            st.mask_review = None
            out = self.view(st, banner=msg + " Press N for the next job.", error="")
        out[self.c.draft_out] = draft_message(None, panel, forget=True)  # confirmed: forget it
        return out

    def _refused(self, st: ReviewerState, exc: ApiError, review: MaskReview) -> Update:
        """A 409: the banner says why, the panel is redrawn from the snapshot the answer carries, and the
        decisions that still apply are kept (``sync_mask``); a new intervention id for the next try."""
        with st.lock:
            already = review.panel.pause_token in st.results
            banner = conflict_text(
                exc.code, already, conflict_banner(exc.code, already_ours=already, message=exc.message)
            )
            if isinstance(exc, ConflictError) and exc.code == "CLAIMED_BY_OTHER" and exc.claim is not None:
                st.held_by = exc.claim
            st.intervention_id = new_intervention_id()
            snap = JobSnapshot.model_validate(exc.snapshot) if isinstance(exc.snapshot, dict) else None
            if snap is not None and snap.job_id == st.job_id and (st.snapshot is None or snap.version >= st.version):
                st.snapshot, st.panel = snap, panel_from_snapshot(snap)
            now = self.sync_mask(st)
            if now is None and st.snapshot is not None:
                banner += f" Nothing is waiting for review on this job now ({st.snapshot.status.value})."
            elif now is not review:
                banner += " The panel now shows the review waiting now."
            st.notice = banner
            return self.refresh_view(st, redraw=True, banner=banner, error="")
