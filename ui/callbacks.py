"""The reviewer app's event handlers, as methods over a ``Components`` value.

They talk to the control plane only through ``client.HitlClient`` (and the
follower through ``client.AsyncHitlClient``) and return component updates as
dicts keyed by the components they were given, so tests can call them with
no browser: build ``Components`` with ``ui.layout.layout`` inside a
``gr.Blocks`` and read the answers by component.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

import gradio as gr

from hitl_review.client import ApiError, ConflictError, HitlClient
from hitl_review.statecore.models import JobSnapshot

from .annotator import (
    AUTO_TARGET,
    box_notes,
    edits_between,
    label_choices,
    read_annotator,
    reapplied_value,
    subjects_from_annotator,
)
from .claims import ClaimHandlers
from .editing import EditorHandlers
from .editor import ALL_STAGES, draft_message
from .images import ImageStore
from .layout import Components
from .panel import Panel, annotator_value, backends_text, is_terminal, status_text
from .prefetch import Prefetcher, take
from .pump import Followers, emission, follow_job
from .queue import TABLE_HEADERS
from .queue_view import THUMBS_PER_TICK as THUMBS_PER_TICK  # where the tests and older callers look
from .queue_view import QueueHandlers, error_text
from .quorum import stage_markdown
from .rebase import rebase_edits, rebase_text, with_mine
from .results import ResultsView
from .session import ReviewerState, conflict_banner
from .shown import Shown
from .signin import SignInHandlers, make_async_client, make_client
from .stats import ReviewStats

Update = dict[Any, Any]

log = logging.getLogger("hitl.ui")


class Clients:
    """One ``HitlClient`` per token: the reviewer's identity is their token (docs/protocol.md § Identity)."""

    def __init__(self, api_url: str) -> None:
        self.api_url = api_url
        self._by_token: dict[str | None, HitlClient] = {}
        self._lock = threading.Lock()

    def get(self, token: str | None) -> HitlClient:
        with self._lock:
            c = self._by_token.get(token)
            if c is None:
                c = self._by_token[token] = make_client(self.api_url, token)  # or as the proxy's user
            return c


class Callbacks(QueueHandlers, EditorHandlers, ClaimHandlers, SignInHandlers):
    """Every handler of the page; ``app.wire`` connects them to ``comps``' events."""

    def __init__(self, comps: Components, api_url: str, store: ImageStore, labels: tuple[str, ...] = ()) -> None:
        self.c = comps
        self.labels = labels
        self.redraws = 0
        self.conflicts = 0  # 409s answered: each sets off the redraw event with a new key
        self.submit_ids = {id(o) for o in comps.submit_outputs()}
        self.stats = ReviewStats()
        self.api_url = api_url
        self.clients = Clients(api_url)
        self.store = store
        self.followers = Followers()
        self.prefetcher = Prefetcher(store)
        self._session_claims: dict[str, tuple[str | None, str]] = {}
        self._claims_lock = threading.Lock()

    # ------------------------------------------------------------------ rendering

    def notes_arrived(self, st: ReviewerState) -> Update:
        """A note on the open job arrived (``ui.pump``): its notes are shown again (``ui.notes_wiring``)."""
        with st.lock:
            return {self.c.notes_key: st.notes_signature()}

    def view(
        self,
        st: ReviewerState,
        *,
        redraw: bool = False,
        banner: str | None = None,
        error: str | None = None,
        results: ResultsView | None = None,
    ) -> Update:
        """Component updates for the reviewer's current state."""
        c = self.c
        snap, panel = st.snapshot, st.panel
        terminal = is_terminal(snap)
        out: Update = {
            c.job_md: f"**Job** `{st.job_id}`" if st.job_id else "No job open — pick one in the queue.",
            c.status_md: status_text(snap) if snap else "",
            c.stage_md: stage_markdown(panel, snap),  # with the quorum, when the job has one (ui.quorum)
            # A button built hidden may come back without its text when an update only shows it: resend the text.
            c.reapply_btn: gr.update(visible=st.offer is not None and panel is not None, value=c.reapply_btn.value),
            c.cancel_btn: gr.update(visible=snap is not None and not terminal, value=c.cancel_btn.value),
            c.current_job: st.job_id or "",
            c.shown_pause: panel.pause_token if panel is not None else "",
            c.notes_key: st.notes_signature(),  # the notes are drawn again only when it changes
        }
        out.update(self.presence_update(st))
        if redraw or panel is None:  # an open confirmation, or full-size view, belongs to the view being replaced
            out.update(c.cut_confirm.update(False) | c.zoom.panel.update(False))
        if redraw or terminal:
            out.update(c.cancel_confirm.update(False))
        if banner is not None:
            out[c.banner_md] = banner
        if error is not None:
            out[c.review_error] = error
        if redraw:
            st.conflict_view = None  # a 409's redraw, if one is due, is this one
        if redraw and panel is not None and st.image_path:
            value = annotator_value(panel, self.store.for_panel(st, panel), relabels=st.relabels)
            st.restart_history(panel)
            self.redraws += 1  # a new key each time: the browser looks for this review's draft again
            out[c.pause_key] = f"{panel.job_id}|{panel.pause_token}|{self.redraws}"
            # with their text: a panel shown again remounts its buttons, and an update without it blanks them
            out[c.undo_btn] = gr.update(interactive=False, value=c.undo_btn.value)
            out[c.redo_btn] = gr.update(interactive=False, value=c.redo_btn.value)
            out[c.annotator] = value
            out[c.notes_md] = box_notes(panel)
            out[c.label_target] = gr.update(
                choices=label_choices(panel, read_annotator(panel, value)), value=AUTO_TARGET
            )
            out[c.label_text] = ""
        if results is not None:
            out.update(c.results_col.update(True))
            out[c.results_md] = results.summary
            out[c.results_gallery] = results.cutouts
            out[c.mask_gallery] = results.overlays
            out[c.results_files] = results.files or None
        elif not terminal:
            out.update(c.results_col.update(False))
        return out

    def refresh_view(
        self, st: ReviewerState, *, redraw: bool, banner: str | None = None, error: str | None = None
    ) -> Update:
        """``view`` after fetching what it needs: the image for a panel, the results of an ended job."""
        client = self.clients.get(st.token)
        results = None
        try:
            if st.panel is not None or is_terminal(st.snapshot):
                self.store.ensure(st, client)
            if is_terminal(st.snapshot):
                results = self.store.results(st, client)
        except Exception as exc:  # shown to the reviewer, the panel stays usable
            banner = ((banner + " ") if banner else "") + error_text(exc)
        with st.lock:  # the redraw and the edits laid over it are one state of the canvas
            out = self.view(st, redraw=redraw, banner=banner, error=error, results=results)
            pending = st.pending_rebase if redraw and st.panel is not None else None
            if pending is not None:
                st.pending_rebase = None
                head = banner if banner is not None else (st.notice or "")
                out.update(self.rebased(st, pending[0], pending[1], head))
        return out

    # ------------------------------------------------------------------ queue

    def on_stats(self, st: ReviewerState) -> Update:
        try:
            return {self.c.stats_md: self.stats.refresh(self.clients.get(st.token))}
        except Exception as exc:  # said in the panel; the button tries again
            return {self.c.stats_md: "Stats unavailable — " + error_text(exc)}

    def on_filters(self, st: ReviewerState, stage: str | None, batch: str | None = "") -> Update:
        st.queue_stage, st.queue_batch = stage or ALL_STAGES, (batch or "").strip()
        if not st.signed_in:
            return {self.c.queue_note: gr.skip()}
        return self.queue_update(st)

    def on_tick(
        self, st: ReviewerState, job: str | None = None, pause: str | None = None, request: gr.Request | None = None
    ) -> Update:
        """The page's timer: renew the open job's claim and check the page shows it (``ui.claims``), then
        refresh the queue. ``job``, ``pause``: the job and pause the page's last view named."""
        if not st.signed_in:
            return {self.c.queue_note: gr.skip()}
        out = self.renew(st) | self.converge(st, job, pause)
        self.remember_session(st, request)
        out.update(self.queue_update(st, quiet=True))
        return out

    # ------------------------------------------------------------------ opening jobs

    def open_job(
        self, st: ReviewerState, job_id: str | None, *, claimed: bool = False, snap: JobSnapshot | None = None
    ) -> Update:
        """Show ``job_id`` and claim it when it waits for review (``claimed``: "next job" already did,
        and ``snap`` is the snapshot its claim answered: no GET then)."""
        job_id = (job_id or "").strip()
        if not job_id:
            return {self.c.banner_md: "No job id."}
        try:
            snap = snap or self.clients.get(st.token).get_job(job_id)
        except Exception as exc:  # said in the banner
            return {self.c.banner_md: f"Could not open {job_id}: " + error_text(exc)}
        holder = None if claimed else self.claim_on_open(st, job_id, snap.active_pause is not None)
        pre = take(st, snap)  # the image fetched ahead, when it is this very state (ui.prefetch)
        st.open(snap)
        st.wait_emissions()  # the job left: its follower's last update goes out before this panel (ui.pump)
        with st.lock:
            st.held_by, st.taken_over = holder, False
            if pre is not None:
                st.image_path = str(pre.image)
        return self.refresh_view(st, redraw=True, banner="", error="")

    def on_queue_select(self, st: ReviewerState, evt: gr.SelectData) -> Update:
        row = evt.row_value or []
        col = TABLE_HEADERS.index("Job")
        job_column = isinstance(evt.index, list | tuple) and evt.index[1] == col
        job_id = row[col] if len(row) > col else (evt.value if job_column else None)
        if not job_id:
            return {self.c.banner_md: gr.skip()}
        return self.open_job(st, str(job_id))  # drawn in this one step, as N draws (ui.app.wire)

    def on_next(self, st: ReviewerState) -> Update:
        """The oldest waiting job nobody else claimed (docs/protocol.md § Claims): claimed with its snapshot
        in one round trip (``POST /claims/next``: a job another reviewer took first is passed over by the
        server, not asked for again from here), then shown."""
        if not st.signed_in:
            return {self.c.banner_md: gr.skip()}
        try:
            taken = self.claim_next(st)
        except Exception as exc:  # said in the banner
            return {self.c.banner_md: error_text(exc)}
        if taken is None:
            st.prefetched = None  # whatever was fetched ahead is not waiting any more
            return {self.c.banner_md: self.nothing_to_open(st)}
        job_id = taken.snapshot.job_id
        # Drawn in this one step: the canvas' column stays mounted (ui.layout), so it has its size when
        # shown; no second event (``after_open``) on the way to the panel.
        try:
            out = self.open_job(st, job_id, claimed=True, snap=taken.snapshot)
        except Exception as exc:  # said in the banner and logged: an N that answers nothing looks dead
            log.exception("opening %s after N", job_id)
            self.release_claim(st, keep=st.job_id)  # not left held for a minute when the page never showed it
            return {self.c.banner_md: f"Could not open {job_id}: " + error_text(exc)}
        self.prefetcher.start(st, self.clients.get(st.token))  # the job N opens after this one (ui.prefetch)
        return out

    def on_load(self, st: ReviewerState, request: gr.Request) -> Update:
        out: Update = {}
        try:
            out[self.c.backend_md] = backends_text(self.clients.get(st.token).readyz())
        except Exception:  # readiness details are optional
            out[self.c.backend_md] = ""
        job = request.query_params.get("job") if request is not None else None
        with st.lock:  # a sign-in under way reads the pending job under the same lock (``on_login``)
            signed_in = st.signed_in
            if job and not signed_in:
                st.job_id = job  # opened after sign-in
        if signed_in:
            out.update(self.queue_update(st))
            if job:
                out.update(self.open_job(st, job))  # drawn in this step, as N and a sign-in at ``?job=`` draw
        return out

    # ------------------------------------------------------------------ following the open job

    async def follow(self, st: ReviewerState, request: gr.Request) -> AsyncGenerator[Update, None]:
        """Live updates of the open job (``ui.pump``); one follower per opened job and session."""
        with st.lock:
            job_id, gen = st.job_id, st.follow_gen
            if not job_id or st.snapshot is None or is_terminal(st.snapshot) or st.followed_gen == gen:
                return
            st.followed_gen = gen
        stop = threading.Event()
        session = request.session_hash if request is not None else None
        self.followers.add(session, stop)
        try:
            async with make_async_client(self.api_url, st.token) as client:
                async for update in follow_job(st, job_id, gen, client, self, stop):
                    yield update
        finally:
            self.followers.discard(session, stop)

    async def follow_on_page(self, st: ReviewerState, request: gr.Request) -> AsyncGenerator[Update, None]:
        """``follow`` as the page runs it: one update that changes nothing first. Gradio answers a generator
        that ends without yielding with None for every output, which emptied the panel just drawn (the
        job, stage and status lines, the box notes, the canvas) whenever a follower ended having had
        nothing to say: the one of the job left for another, a second one for the same opening."""
        yield {self.c.banner_md: gr.skip()}
        async for update in self.follow(st, request):
            yield update
        # Gradio's completion message carries the last update again, sent once the follower has returned,
        # so after the counted emissions (ui.pump.emission): were it the ended job's view, it could land
        # after the next job's panel (N pressed as the job ended) and put the ended job back on screen.
        yield {self.c.banner_md: gr.skip()}

    def on_unload(self, request: gr.Request) -> None:
        self.followers.stop(request.session_hash)
        self.release_session(request.session_hash)

    def after_open(self, st: ReviewerState) -> Update:
        """The second step of opening a job (a sign-in, a load, a queue click, N, Take over): draw the
        panel and its canvas, now that the first step has laid the panel out (see ``ui.app.wire``)."""
        with st.lock:
            if not st.undrawn or not st.job_id or st.snapshot is None:  # the first step opened nothing
                return {self.c.banner_md: gr.skip()}
            st.undrawn = False
            out = self.refresh_view(st, redraw=True, banner=st.notice, error="")
        self.prefetcher.start(st, self.clients.get(st.token))  # the job N opens next (ui.prefetch)
        return out

    def after_take_over(self, st: ReviewerState) -> Update:
        return self.after_open(st)

    # ------------------------------------------------------------------ editing

    def on_reapply(self, st: ReviewerState) -> Update:
        with st.lock:
            if st.offer is None or st.panel is None or not st.image_path:
                return {self.c.reapply_btn: gr.update(visible=False)}
            value, st.relabels = reapplied_value(st.panel, st.offer, self.store.for_panel(st, st.panel))
            st.offer = None
            st.notice = "Your edits were re-applied — check them, then submit."
        return {
            self.c.annotator: value,
            self.c.reapply_btn: gr.update(visible=False),
            self.c.review_error: "",
            self.c.banner_md: st.notice,
        }

    # ------------------------------------------------------------------ submitting

    def send(self, st: ReviewerState, value: Any, *, empty: bool) -> Update:
        """Submit the annotator's boxes (or nothing) for the panel they were drawn on."""
        with st.lock:
            if st.held_by is not None:  # another reviewer has the job (docs/protocol.md § Claims)
                return {self.c.review_error: f"{st.held_by.reviewer} has this job: press “Take over” to submit."}
            panel = st.panel_for(value)
            if panel is None or panel.pause_token in st.results:
                # e.g. a second click after the first one's answer closed the panel: one result
                return {
                    self.c.review_error: "",
                    self.c.banner_md: st.notice or "Nothing is waiting for review on this job.",
                }
            edits = None
            subjects: list[dict[str, Any]] = []
            if not empty:
                relabels = st.relabels_for(panel)
                subjects, err = subjects_from_annotator(panel, value, relabels)
                if err:
                    return {self.c.review_error: err}
                edits = edits_between(panel, read_annotator(panel, value), relabels)
            iv = st.submission_id()
            st.sending = panel.pause_token  # the follower does not take it for another reviewer's (ui.session)
        client = self.clients.get(st.token)
        try:
            try:
                res = client.intervene(
                    panel.job_id,
                    intervention_id=iv,
                    pause_token=panel.pause_token,
                    base_version=panel.base_version,
                    subjects=subjects,
                    snapshot_id=panel.snapshot_id,
                )
            except ApiError as exc:
                if exc.status_code == 409:
                    rebase = exc.rebase if isinstance(exc, ConflictError) else None
                    # Recorded under the lock: the follower applies and renders a newer snapshot under it too
                    # (``ui.pump``). The answer says the banner at once; the panel is drawn by the event the new
                    # ``redraw_key`` sets off (``on_conflict_view``), unless a follower's redraw comes first
                    # (it lays the edits over the new round and clears ``conflict_view``): drawn once either way.
                    with st.lock:
                        outcome = st.record_conflict(
                            exc.code, exc.snapshot, edits, exc.message, submitted=panel, rebased=rebase is not None
                        )
                        if (
                            outcome.redraw
                            and rebase is not None
                            and edits is not None
                            and not edits.is_empty()
                            and st.panel is not None
                        ):
                            st.pending_rebase = (edits, rebase)  # laid over the redrawn panel by refresh_view
                        st.conflict_view = (outcome.redraw, outcome.banner)
                        self.conflicts += 1
                        return {
                            self.c.banner_md: outcome.banner,
                            self.c.review_error: "",
                            self.c.redraw_key: f"{panel.job_id}|{self.conflicts}",
                        }
                return {self.c.review_error: f"The server refused the submission: {exc.message} ({exc.code})."}
            except Exception as exc:  # the same intervention id is kept for the retry
                return {
                    self.c.review_error: error_text(exc) + " Press Submit again: it resends the same submission "
                    "(same id), so it cannot count twice."
                }
            msg = st.record_success(
                panel.pause_token,
                res.status,
                res.version,
                res.next_node_type,
                len(res.diff.kept),
                len(res.diff.added),
                len(res.diff.deleted),
                res.quorum.model_dump() if res.quorum else None,
            )
        finally:
            st.sending = None
        st.claimed = None  # an accepted submission ends the claim (docs/protocol.md § Claims)
        with st.lock:  # confirmed: the browser forgets the draft
            st.answered_view = (panel.job_id, st.follow_gen, draft_message(panel.job_id, panel.pause_token, None))
        return {self.c.banner_md: msg + " Press N for the next job.", self.c.review_error: ""}

    def after_submit(self, st: ReviewerState) -> Iterator[Update]:
        """The panel after an accepted submission, in the event that follows its answer: the review
        closed, the buttons and lines as the job now is, the browser's draft forgotten. Nothing after a
        refusal or a 409 (their answer said it all, a 409's redraw has its own event), nor once another
        job is open. Sent as a follower's update is (``ui.pump.emission``): a job N opens meanwhile waits
        for it, so this view of the job left never lands over the next job's panel; and a last update
        that changes nothing, since Gradio's completion message repeats the last one."""
        with st.lock:
            due, st.answered_view = st.answered_view, None
        if due is not None:
            job_id, gen, draft = due
            shown: Panel | None = None
            with emission(st, job_id, gen, threading.Event()) as ok:
                if ok:
                    with st.lock:
                        out, shown = self.view(st, error=""), st.panel
                    out[self.c.draft_out] = draft
                    yield self.within(out, self.submit_ids, "the panel's update after a submission")
            # A round the follower opened while that update was on its way: the follower's panel may have
            # reached the page first, and that update (the review closed) over it. The panel as it is now.
            with emission(st, job_id, gen, threading.Event()) as ok:
                with st.lock:
                    reopened = ok and st.panel is not None and st.panel is not shown
                    out = self.view(st, error="") if reopened else {}
                if out:
                    yield self.within(out, self.submit_ids, "the panel's update after a submission")
            # The job N opens next (ui.prefetch), fetched once the answer and this update are on their way, not
            # on the cores that are sending and drawing them.
            self.prefetcher.start(st, self.clients.get(st.token))
        yield {self.c.banner_md: gr.skip()}

    def within(self, out: Update, allowed: set[int], what: str) -> Update:
        """``out`` within an event's outputs (Gradio refuses an answer naming any other output). A view
        without a redraw stays within ``Components.submit_outputs``; anything else is dropped, and
        logged: a bug to fix there."""
        extra = [k for k in out if id(k) not in allowed]
        if extra:
            log.warning("%s named outputs its event does not have: %s", what, extra)
        return {k: v for k, v in out.items() if id(k) in allowed}

    def on_conflict_view(self, st: ReviewerState) -> Update:
        """The panel a submission's 409 asked for (``send``): the new round drawn, the reviewer's edits laid
        over it. Nothing when a follower's redraw drew it first."""
        with st.lock:
            due, st.conflict_view = st.conflict_view, None
            if due is None:
                return {self.c.banner_md: gr.skip()}
            return self.refresh_view(st, redraw=due[0], banner=due[1], error="")

    def rebased(self, st: ReviewerState, edits: Any, rebase: dict[str, Any], head: str) -> Update:
        """After a 409: the reviewer's edits laid over the redrawn panel by ``ui.rebase`` — those nobody
        else touched at once, the conflicting ones left for a decision (docs/protocol.md § Rebase help)."""
        with st.lock:
            panel = st.panel
            if panel is None or not st.image_path:
                return {}
            res = rebase_edits(edits, rebase, [pb.box_id for pb in panel.boxes])
            st.rebased_over = (panel.pause_token, edits)  # a 409 for these edits has nothing left to redraw
            out = self.show_edits(st, panel, res.applied) if not res.applied.is_empty() else {}
            st.carry = None
            st.offer = with_mine(res) if not res.mine.is_empty() else None
            st.notice = (head + " " + rebase_text(res, {pb.box_id: pb.tag for pb in panel.boxes})).strip()
            out[self.c.banner_md] = st.notice
            out[self.c.reapply_btn] = gr.update(visible=st.offer is not None, value=self.c.reapply_btn.value)
            return out

    def on_submit(self, st: ReviewerState, value: Any) -> Update:
        return self.send(st, value, empty=False)

    def on_cut_nothing(self, st: ReviewerState, value: Any) -> Update:
        return self.send(st, value, empty=True)

    def on_cancel(self, st: ReviewerState) -> Update:
        if not st.job_id:
            return {self.c.banner_md: gr.skip()}  # a dict must name a component
        try:
            snap = self.clients.get(st.token).cancel(st.job_id)
        except ApiError as exc:
            if exc.status_code == 409 and exc.snapshot:
                st.apply_snapshot(JobSnapshot.model_validate(exc.snapshot))
                return self.refresh_view(st, redraw=True, banner=conflict_banner(exc.code, message=exc.message))
            return {self.c.banner_md: error_text(exc)}
        except Exception as exc:  # said in the banner
            return {self.c.banner_md: error_text(exc)}
        st.apply_snapshot(snap)
        return self.refresh_view(st, redraw=True, banner="The job was cancelled.")


def show(*comps: tuple[Shown, bool]) -> Callable[[], Update]:
    """A handler that shows or hides containers (the confirmation rows)."""
    return lambda: {s.style: s.set(v) for s, v in comps}
