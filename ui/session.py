"""One reviewer's session: the open job, its panels, the pending submission and what the banner says.

``ReviewerState`` holds it (in ``gr.State``); the rules for a live update,
a successful submission and a 409 live here as methods, so they can be
tested without a server (docs/protocol.md § Intervention, § Second round).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from hitl_review.client import new_intervention_id
from hitl_review.statecore.models import Box, ClaimView, JobSnapshot
from hitl_review.statecore.states import JobStatus

from .annotator import Edits, applicable_edits
from .editor import ALL_STAGES, EditHistory, copy_edits
from .panel import Panel, is_terminal, panel_from_snapshot, pause_of_value
from .quorum import vote_banner
from .rebase import changes_between

NEXT_NODE_WORDS = {
    "VALIDATE_MANUAL_BOX_LIST": "checking the names of the drawn boxes",
    "PROCESS_APPROVED_BOX_LIST": "cutting out the approved subjects",
}


def conflict_banner(code: str, *, already_ours: bool = False, message: str = "") -> str:
    """A 409 in plain words."""
    if code in ("PAUSE_TOKEN_MISMATCH", "PAUSE_NOT_ACTIVE"):
        return "This review was already submitted." if already_ours else "Another reviewer submitted first."
    if code == "VERSION_CONFLICT":
        return "Your view was out of date: the job changed after you opened it."
    if code == "JOB_CANCELLED":
        return "The job was cancelled, so this review can no longer be submitted."
    if code == "IDEMPOTENCY_CONFLICT":
        return "This review was already submitted with different boxes."
    if code == "JOB_TERMINAL":
        return "The job had already ended."
    if code == "SNAPSHOT_MISMATCH":
        return "Your view was out of date: the boxes waiting now are not the ones you reviewed."
    if code == "WORKFLOW_VERSION_INCOMPATIBLE":
        return "This review was re-offered under the current workflow definition (it cannot be continued as opened)."
    return message or f"The server refused the request ({code})."


def submitted_message(
    status: str, next_node_type: str | None, kept: int, added: int, deleted: int, quorum: dict[str, Any] | None = None
) -> str:
    voted = vote_banner({"quorum": quorum}) if quorum else None  # docs/protocol.md § Quorum
    if voted is not None:
        return f"Submitted — kept {kept}, added {added}, deleted {deleted}. {voted}"
    nxt = NEXT_NODE_WORDS.get(next_node_type or "", "nothing more: the job has ended")
    return f"Submitted — kept {kept}, added {added}, deleted {deleted}. The job is now {status}; next: {nxt}."


def own_round_banner(panel: Panel) -> str:
    """The banner when this reviewer's own submission leads to a new review round (the validator sent
    boxes back): a reviewer who just pressed Submit is told their review counted and why a panel is back."""
    problems = sum(1 for pb in panel.boxes if pb.problem)
    if problems:
        boxes = "1 box" if problems == 1 else f"{problems} boxes"
        return f"Your review was accepted; {boxes} did not pass naming — round {panel.round} is open below."
    return f"Your review was accepted. A new review round ({panel.round}) is open below."


@dataclass
class SnapshotChange:
    applied: bool
    redraw: bool = False
    banner: str | None = None


@dataclass
class ConflictOutcome:
    banner: str
    redraw: bool
    offer: Edits | None
    dropped: list[str]


class ReviewerState:
    """Everything one reviewer's browser session holds (kept in ``gr.State``).

    ``intervention_id`` lives from the first click on Submit until that
    submission succeeds or a 409 arrives: a double click or a retry after a
    network error sends the same id, and the server replays the first answer.
    Handlers of one session run concurrently (a follower streams while the
    reviewer clicks), so changes go through ``lock``. A plain class, not a
    dataclass: Gradio would try to serialise a dataclass (and its lock) into
    the page config.
    """

    def __init__(self, token: str | None = None, signed_in: bool = False) -> None:
        self.token = token
        self.signed_in = signed_in
        self.job_id: str | None = None
        self.snapshot: JobSnapshot | None = None
        self.panels: dict[str, Panel] = {}  # every panel of the open job shown so far, by pause token
        self._panel: Panel | None = None
        self.relabels: dict[str, str] = {}
        self.old_relabels: dict[str, dict[str, str]] = {}  # relabels of panels replaced meanwhile, by pause
        self.intervention_id: str | None = None
        self.results: dict[str, str] = {}  # pause_token -> the one result message shown for it
        self.offer: Edits | None = None  # the reviewer's edits offered for re-applying after a conflict
        self.carry: Edits | None = None  # edits from a conflict, kept until a panel they can go onto
        self.seen_token: str | None = None  # the pause of the last panel shown
        self.image_path: str | None = None
        self.notice: str | None = None  # the last thing the banner said about this job's review
        self.queue_stage = ALL_STAGES  # the queue's stage filter
        self.queue_batch = ""  # the queue's batch filter ("": every batch)
        self.queue_flagged = False  # the queue's "Flagged only" filter (ui.notes_view)
        self.queue_sent: list[list[Any]] | None = None  # the queue's rows last sent, without their ages
        self.queue_sent_at = 0.0  # time.monotonic() of that
        self.history: EditHistory | None = None  # undo/redo of the open review's box edits
        self.server_set: list[Edits] = []  # states the app put on the canvas since the reviewer's last edit
        self.reviewer: str | None = None  # this reviewer's name, as their own claims spell it
        self.claimed: str | None = None  # the job this session holds a claim on (docs/protocol.md § Claims)
        self.held_by: ClaimView | None = None  # another reviewer's claim on the open job: no editing
        self.taken_over = False  # held_by took the job over from this session (a renewal got 409)
        self.renewed_at = 0.0  # time.monotonic() of the last claim or renewal
        # The reviewer's edits and the box-level change under them, to lay over the next redraw (ui.rebase).
        self.pending_rebase: tuple[Edits, dict[str, Any]] | None = None
        self.carry_base: list[Box] | None = None  # the boxes ``carry`` was made over (rebased when a panel opens)
        self.rebased_over: tuple[str, Edits] | None = None  # a pause drawn with these edits laid over it (ui.rebase)
        self.undrawn = False  # a job was just opened with an empty canvas: the next step draws it
        self.mask_review: Any = None  # the open mask review (ui.mask_review.MaskReview), or None
        self.box_list: Any = None  # hidden and locked boxes of the open review (ui.box_list.BoxListState)
        self.prefetched: Any = None  # the job N opens next, fetched ahead (ui.prefetch.Prefetched)
        self.follow_gen = 0  # bumped by every open; a follower of an older generation stops
        self.emitting = 0  # followers' updates between their last check and being sent (ui.pump.emission)
        self.sending: str | None = None  # the pause a submission of this session is in flight for
        # A submission's 409 answered: (redraw, banner) for the event that draws it (Callbacks.on_conflict_view);
        # any redraw of the panel meanwhile (a follower's) draws it first and clears this.
        self.conflict_view: tuple[bool, str | None] | None = None
        # A submission accepted: (job, open generation, draft message: the browser forgets the draft) for the
        # panel's update that follows the answer (Callbacks.after_submit).
        self.answered_view: tuple[str, int, str] | None = None
        self.followed_gen = -1  # the generation a follower already serves
        # The page's timer saw it show another job than the open one: (job, open generation, since when).
        self.unseen: tuple[str, int, float] | None = None
        self.lock = threading.RLock()

    def __deepcopy__(self, memo: dict[int, Any]) -> ReviewerState:
        clone = ReviewerState()
        for name, value in vars(self).items():
            if name != "lock":
                setattr(clone, name, copy.deepcopy(value, memo))
        return clone

    @property
    def panel(self) -> Panel | None:
        """The review open now (the job's active pause), or None."""
        return self._panel

    @panel.setter
    def panel(self, value: Panel | None) -> None:
        self._panel = value
        if value is not None:
            self.panels[value.pause_token] = value

    @property
    def reviewing(self) -> bool:
        """A review is open on the page: a box panel, or a mask review (ui.mask_review_view)."""
        return self._panel is not None or self.mask_review is not None

    def panel_for(self, value: Any) -> Panel | None:
        """The panel an annotator value was drawn for, which may be older than ``panel``: a submission
        is read against what the reviewer saw, and the server judges whether it is stale. A value
        that names no pause is taken as drawn for the open panel."""
        token = pause_of_value(value)
        return self.panels.get(token) if token else self.panel

    def relabels_for(self, panel: Panel) -> dict[str, str]:
        """The labels the reviewer set on ``panel``'s boxes, also when a newer state replaced it meanwhile
        (a submission is read against the panel it was drawn for)."""
        return self.relabels if panel is self.panel else self.old_relabels.get(panel.pause_token, {})

    def history_for(self, panel: Panel) -> EditHistory:
        """The undo stack of ``panel``'s review (a fresh one for a new pause)."""
        if self.history is None or self.history.pause_token != panel.pause_token:
            self.history = EditHistory(panel.pause_token)
            self.server_set = []
        return self.history

    def restart_history(self, panel: Panel) -> None:
        """The canvas was redrawn from the panel alone: editing starts again from the offered boxes."""
        self.history = EditHistory(panel.pause_token)
        self.server_set = [Edits()]

    def shown_by_app(self, panel: Panel, edits: Edits, replaced: Edits | None = None) -> EditHistory:
        """The app put ``edits`` on the canvas (undo, redo, reset, a label, a restored draft) in place of
        ``replaced`` (default: the history's current state; undo and redo have moved it already)."""
        hist = self.history_for(panel)
        was = hist.current if replaced is None else replaced
        # What the canvas showed until now can still echo back (a click sent before this arrived).
        self.server_set = [*self.server_set[-8:], copy_edits(was), copy_edits(edits)]
        hist.record(edits)
        return hist

    def canvas_changed(self, panel: Panel, edits: Edits) -> bool:
        """The canvas sent ``edits``; True when they are a new state of the review (recorded).

        The browser reports every value it shows, also the ones the app sent; such a report can
        arrive after a later state was already sent (a redraw's echo after a restored draft), so
        a report equal to an older app-sent state is stale and ignored.
        """
        hist = self.history_for(panel)
        if self.server_set and edits in self.server_set[:-1] and edits != self.server_set[-1]:
            return False
        if self.server_set and edits != self.server_set[-1]:
            self.server_set = []  # the reviewer's own edit: older echoes can no longer arrive
        return hist.record(edits)

    @property
    def last_result(self) -> str | None:
        return next(reversed(self.results.values()), None)

    @property
    def version(self) -> int:
        return self.snapshot.version if self.snapshot else -1

    def open(self, snap: JobSnapshot) -> None:
        """Show ``snap``'s job from scratch (a click in the queue, "next job", a reload)."""
        with self.lock:
            same_pause = (
                self.panel is not None
                and self.job_id == snap.job_id
                and snap.active_pause is not None
                and self.panel.pause_token == snap.active_pause.pause_token
            )
            if snap.job_id != self.job_id:
                self.panels, self.old_relabels = {}, {}
            self.job_id = snap.job_id
            self.snapshot = snap
            self.panel = panel_from_snapshot(snap)
            self.seen_token = self.panel.pause_token if self.panel else None
            self.relabels = {}
            self.offer = None
            self.carry = None
            self.carry_base = None
            self.rebased_over = None
            self.notice = None
            if not same_pause:
                self.intervention_id = None
            self.follow_gen += 1

    def wait_emissions(self, timeout: float = 2.0) -> None:
        """After an opening: until the updates followers were sending of the job left are sent (they check the
        job under the lock, so none starts after the opening), at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.emitting > 0 and time.monotonic() < deadline:
            time.sleep(0.01)

    def apply_snapshot(self, snap: JobSnapshot) -> SnapshotChange:
        """A newer snapshot of the open job (from events or polling). Redraws only when the pause changed."""
        with self.lock:
            if snap.job_id != self.job_id or snap.version < self.version:
                return SnapshotChange(applied=False)
            old = self.panel
            self.snapshot = snap
            new = panel_from_snapshot(snap)
            if new is not None and new.pause_token in self.results:
                # This reviewer answered that pause (a quorum vote: it waits for others): it stays
                # closed here, so the page does not claim it again and hold it from the others.
                new = None
            old_token = old.pause_token if old else None
            new_token = new.pause_token if new else None
            if old_token == new_token:
                self.panel = new
                if new is None and is_terminal(snap) and not (self.notice or "").startswith("The job ended"):
                    # Replace what the banner said about the submission ("now PROCESSING…").
                    reason = f" ({snap.reason_code})" if snap.reason_code else ""
                    self.notice = f"The job ended: {snap.status.value}{reason}."
                    return SnapshotChange(applied=True, banner=self.notice)
                return SnapshotChange(applied=True)
            if old is not None and self.relabels:
                self.old_relabels[old.pause_token] = self.relabels
            self.panel = new
            self.relabels = {}
            self.offer = None
            self.intervention_id = None
            # The pause this reviewer last had in front of them: was it answered by someone else?
            last = old_token or self.seen_token
            # (not while this reviewer's own submission of it is in flight: its answer says what came of it)
            by_other = last is not None and last not in self.results and last != self.sending
            hist = self.history
            if (
                by_other
                and old is not None
                and new is not None
                and hist is not None
                and hist.pause_token == old.pause_token
                and not hist.current.is_empty()
            ):  # the reviewer was editing: their edits go onto the new pause's boxes (docs/protocol.md § Rebase help)
                base = [pb.box for pb in old.boxes]
                self.pending_rebase = (copy_edits(hist.current), changes_between(base, [pb.box for pb in new.boxes]))
            if new is not None:
                self.seen_token = new_token
                if by_other:
                    banner = "Another reviewer submitted the previous round. A new review round is open below."
                else:  # says what came of this reviewer's own submission instead of what it said while in flight
                    banner = own_round_banner(new)
                if self.carry is not None and self.carry_base is not None:
                    self.pending_rebase = (self.carry, changes_between(self.carry_base, [pb.box for pb in new.boxes]))
                    self.carry = self.carry_base = None
                elif self.carry is not None:
                    banner = (banner + self._offer_text(self._offer_carried())).strip()
            elif old is not None and by_other:
                banner = (
                    "The job was cancelled."
                    if snap.status == JobStatus.CANCELLED
                    else "Another reviewer submitted first."
                )
                if hist is not None and hist.pause_token == old.pause_token and not hist.current.is_empty():
                    # No pause now (the job is in model work): keep the edits for the next round's panel,
                    # laid over its boxes when it opens, as when the new round arrives at once (above).
                    self.carry, self.carry_base = copy_edits(hist.current), [pb.box for pb in old.boxes]
            else:
                banner = None
            if banner is not None:
                self.notice = banner
            return SnapshotChange(applied=True, redraw=True, banner=banner)

    def notes_signature(self) -> str:
        """What the open job's notes (``ui.notes_view``: its flag, comments and controls) are drawn from, as a
        short key: the notes are drawn again when it changes (``ui.notes_wiring``), not on every view of the
        job (a status line moving on is not a change of its notes). "" when no job is open."""
        snap = self.snapshot
        if not self.job_id or snap is None or snap.job_id != self.job_id:
            return ""
        live = not is_terminal(snap)
        said = [
            snap.job_id,
            self.reviewer,
            live,
            live and snap.active_pause is not None,
            snap.flag.model_dump(mode="json") if snap.flag is not None else None,
            [c.model_dump(mode="json") for c in snap.comments],
        ]
        return hashlib.blake2b(json.dumps(said, sort_keys=True).encode(), digest_size=8).hexdigest()

    def submission_id(self) -> str:
        with self.lock:
            if self.intervention_id is None:
                self.intervention_id = new_intervention_id()
            return self.intervention_id

    def record_success(
        self,
        pause_token: str,
        status: str,
        version: int,
        next_node_type: str | None,
        kept: int,
        added: int,
        deleted: int,
        quorum: dict[str, Any] | None = None,
    ) -> str:
        """The pause is consumed (or, on a quorum pause, this reviewer's vote recorded): close the panel.
        A second answer for it shows the same one result."""
        with self.lock:
            if pause_token in self.results:
                return self.results[pause_token]
            msg = submitted_message(status, next_node_type, kept, added, deleted, quorum)
            self.results[pause_token] = msg
            self.notice = msg
            self.intervention_id = None
            self.offer = None
            if self.panel is not None and self.panel.pause_token == pause_token:
                self.panel = None
                self.relabels = {}
                if self.snapshot is not None and version > self.snapshot.version:
                    self.snapshot = self.snapshot.model_copy(
                        update={
                            "status": JobStatus(status),
                            "version": version,
                            "active_pause": None,
                            "pending_actions": [],
                        }
                    )
            return msg

    def record_conflict(
        self,
        code: str,
        snapshot: dict[str, Any] | JobSnapshot | None,
        edits: Edits | None,
        message: str = "",
        submitted: Panel | None = None,
        rebased: bool = False,
    ) -> ConflictOutcome:
        """A 409: plain-words banner, redraw from the snapshot it carries, a NEW intervention id,
        and the reviewer's edits offered again where their boxes still exist (now, or when the
        next review round of this job opens). ``submitted`` is the panel the refused submission
        answered (default: the open one). ``rebased``: the caller lays the edits over the new panel
        itself (``ui.rebase``); they are kept here only for a later panel when none is open now."""
        with self.lock:
            old = submitted or self.panel
            already = old is not None and old.pause_token in self.results
            snap = JobSnapshot.model_validate(snapshot) if isinstance(snapshot, dict) else snapshot
            if snap is not None and snap.job_id != self.job_id:
                snap = None
            if snap is not None and self.snapshot is not None and snap.version < self.snapshot.version:
                snap = self.snapshot  # the live updates already showed a newer state than the 409 carries
            new = panel_from_snapshot(snap) if snap is not None else None
            pause_gone = old is not None and (new is None or new.pause_token != old.pause_token)
            if (
                pause_gone
                and new is not None
                and self.panel is not None
                and self.panel.pause_token == new.pause_token
                and self.rebased_over == (new.pause_token, edits)
            ):
                # The live updates already drew the new round with these very edits laid over it
                # (``apply_snapshot``): nothing to redraw, and the banner keeps what it says about them.
                self.intervention_id = new_intervention_id()
                return ConflictOutcome(banner=self.notice or "", redraw=False, offer=self.offer, dropped=[])
            banner = conflict_banner(code, already_ours=already, message=message)
            if code == "VERSION_CONFLICT" and pause_gone:
                banner = banner.split(":")[0] + (
                    ": this review was already submitted." if already else ": another reviewer submitted first."
                )
            self.intervention_id = new_intervention_id()
            self.carry = edits if edits is not None and not edits.is_empty() else None
            self.offer, dropped = None, []
            if snap is not None:
                self.snapshot, self.panel, self.relabels = snap, new, {}
                if new is not None:
                    self.seen_token = new.pause_token
                if new is None:
                    banner += f" Nothing is waiting for review on this job now ({snap.status.value})."
                elif pause_gone:
                    banner += " A new review round is open; the panel now shows it."
                else:
                    banner += " The panel was redrawn from the current state."
                if rebased and new is not None:
                    self.carry = None
                elif rebased and self.carry is not None and old is not None:
                    self.carry_base = [pb.box for pb in old.boxes]  # rebased when the next panel opens
                dropped = self._offer_carried()
            banner += self._offer_text(dropped)
            self.notice = banner
            return ConflictOutcome(banner=banner, redraw=snap is not None, offer=self.offer, dropped=dropped)

    def _offer_carried(self) -> list[str]:
        """Offer the edits kept from a conflict against the panel now shown (once)."""
        if self.carry is None or self.panel is None:
            return []
        offer, dropped = applicable_edits(self.panel, self.carry)
        self.carry = None
        self.offer = None if offer.is_empty() else offer
        return dropped

    def _offer_text(self, dropped: list[str]) -> str:
        text = ""
        if self.offer is not None:
            text += f" Your edits ({self.offer.describe()}) can be re-applied with “Re-apply my edits”."
        if dropped:
            text += f" Not re-applicable (box gone): {', '.join(dropped)}."
        return text
