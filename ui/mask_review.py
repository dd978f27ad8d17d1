"""The mask review's pure parts (docs/protocol.md § Cut-out quality, SPEC §13): which subjects a
``WAITING_MASK_REVIEW`` pause lists, the reviewer's decision on each (accept, reject with a reason,
refine with points), what a submission sends, and what of a reviewer's decisions still applies after
the panel was redrawn from another snapshot (a 409, a re-offered pause, a reload).

No Gradio and no I/O here (tests/test_ui_mask_review.py); ``ui.mask_render`` draws the images and
``ui.mask_review_view`` puts them on the page.

A decision still applies to a redrawn panel when the same subject is listed there and what the
reviewer judged is unchanged: an accept or a reject is about the mask as shown (same ``mask_url``);
a refinement's points are about the subject's box (same ``bbox``), whatever mask is shown.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hitl_review.statecore.models import ImageRef, JobSnapshot, QualityVerdict

MASK_STAGE = "WAITING_MASK_REVIEW"
MASK_STAGE_TEXT = "Check the cut-outs the quality gate did not pass"
DecisionKind = Literal["ACCEPT", "REJECT", "REFINE"]
KINDS: tuple[DecisionKind, ...] = ("ACCEPT", "REJECT", "REFINE")
KIND_WORDS = {"ACCEPT": "Accept", "REJECT": "Reject", "REFINE": "Refine"}
MAX_POINTS = 32  # the preview route's limit (docs/protocol.md § Cut-out quality)
MAX_REASON = 500
DRAFT_PREFIX = "hitl-draft:mask:"  # localStorage, beside the box stages' drafts (ui.editor.DRAFT_PREFIX)


@dataclass(frozen=True)
class MaskSubject:
    """One subject of the pause: its place in the list (``n``, 1-based), box, mask and the gate's verdict."""

    n: int
    box_id: str
    label: str | None
    bbox: tuple[float, float, float, float]
    mask_url: str | None
    cutout_url: str | None
    quality: QualityVerdict | None
    reason: str | None = None  # why it waits without a verdict (none given; or a blind review: statecore.gate_spot)

    @property
    def name(self) -> str:
        return f"#{self.n} {self.label or '(no label)'}"


@dataclass(frozen=True)
class MaskPanel:
    """One open mask review: the pause it answers and the subjects it lists."""

    job_id: str
    pause_token: str
    base_version: int
    snapshot_id: str
    image: ImageRef
    subjects: tuple[MaskSubject, ...]

    def by_id(self, box_id: str) -> MaskSubject | None:
        return next((s for s in self.subjects if s.box_id == box_id), None)


def mask_panel_from_snapshot(snap: JobSnapshot | None) -> MaskPanel | None:
    """The mask review waiting on ``snap``'s job, or None (decided from ``active_pause`` alone)."""
    pause = snap.active_pause if snap is not None else None
    if snap is None or pause is None or pause.status != "WAITING" or pause.stage != MASK_STAGE:
        return None
    listed = pause.subjects_to_review or []
    subjects = tuple(
        MaskSubject(
            n=i + 1,
            box_id=s.box_id,
            label=s.label,
            bbox=(float(s.bbox[0]), float(s.bbox[1]), float(s.bbox[2]), float(s.bbox[3])),
            mask_url=s.mask_url,
            cutout_url=s.cutout_url,
            quality=s.quality,
            reason=s.reason,
        )
        for i, s in enumerate(listed)
    )
    if not subjects:
        return None
    return MaskPanel(snap.job_id, pause.pause_token, pause.base_version, pause.snapshot_id, snap.image, subjects)


@dataclass(frozen=True)
class Point:
    """A click on the image, in the image's pixels: ``positive`` part of the subject, else not."""

    x: float
    y: float
    positive: bool

    def to_json(self) -> dict[str, Any]:
        return {"x": round(self.x, 1), "y": round(self.y, 1), "positive": self.positive}


@dataclass
class Decision:
    """The reviewer's decision on one subject so far (``kind`` None: none yet). The reason and the
    points stay while the reviewer switches between decisions, so nothing typed or clicked is lost."""

    kind: DecisionKind | None = None
    reason: str = ""
    points: list[Point] = field(default_factory=list)

    def problem(self) -> str | None:
        """What keeps this decision from being sent, in words (None: it can be sent)."""
        if self.kind is None:
            return "no decision yet"
        if self.kind == "REJECT" and not self.reason.strip():
            return "Reject needs a reason"
        if self.kind == "REFINE" and not self.points:
            return "Refine needs at least one point on the image"
        return None

    def words(self) -> str:
        if self.kind is None:
            return "undecided"
        if self.kind == "REJECT":
            reason = self.reason.strip()
            return f"Reject: “{_clip(reason, 40)}”" if reason else "Reject (reason needed)"
        if self.kind == "REFINE":
            n = len(self.points)
            return f"Refine: {n} point{'s' if n != 1 else ''}" if n else "Refine (click the image to add points)"
        return "Accept"


@dataclass(frozen=True)
class Preview:
    """The preview route's answer for one subject and the points it was asked for."""

    box_id: str
    points: tuple[Point, ...]
    mask_png: bytes
    area: int
    quality: QualityVerdict | None
    ms: float | None


@dataclass
class MaskReview:
    """One reviewer's work on a mask review: a decision per subject, the subject shown, the previews."""

    panel: MaskPanel
    decisions: dict[str, Decision] = field(default_factory=dict)
    current: int = 0
    previews: dict[str, Preview] = field(default_factory=dict)
    drawn: bool = False  # the page shows this review (False: the next view draws it)
    told: str = ""  # what the banner should add about decisions kept from an earlier panel
    tag: str = field(default_factory=lambda: secrets.token_hex(4))  # names this review's pictures

    @property
    def subject(self) -> MaskSubject:
        return self.panel.subjects[self.current]

    def decision(self, box_id: str | None = None) -> Decision:
        key = box_id or self.subject.box_id
        return self.decisions.setdefault(key, Decision())

    def go(self, step: int) -> MaskSubject:
        """Show the subject ``step`` places further (wrapping around)."""
        self.current = (self.current + step) % len(self.panel.subjects)
        return self.subject

    def show(self, box_id: str) -> bool:
        for i, s in enumerate(self.panel.subjects):
            if s.box_id == box_id:
                self.current = i
                return True
        return False

    def next_undecided(self) -> bool:
        """Show the next subject after the current one that still needs something; False when none does."""
        n = len(self.panel.subjects)
        for step in range(1, n + 1):
            s = self.panel.subjects[(self.current + step) % n]
            if self.decision(s.box_id).problem() is not None:
                self.current = (self.current + step) % n
                return True
        return False

    def decide(self, kind: DecisionKind, reason: str | None = None) -> Decision:
        d = self.decision()
        d.kind = kind
        if reason is not None:
            d.reason = _clip(reason.strip(), MAX_REASON)
        return d

    def add_point(self, x: float, y: float, positive: bool) -> str | None:
        """A point for the current subject (the decision becomes Refine); an error in words, or None."""
        w, h = self.panel.image.width, self.panel.image.height
        if not (0 <= x <= w and 0 <= y <= h):
            return "That click is outside the image."
        d = self.decision()
        if len(d.points) >= MAX_POINTS:
            return f"At most {MAX_POINTS} points per subject: remove one first (Ctrl+Z)."
        d.kind = "REFINE"
        d.points.append(Point(min(max(x, 0.0), w - 0.5), min(max(y, 0.0), h - 0.5), positive))
        return None

    def undo_point(self) -> bool:
        d = self.decision()
        if not d.points:
            return False
        d.points.pop()
        return True

    def clear_points(self) -> None:
        self.decision().points.clear()

    def preview(self, box_id: str | None = None) -> Preview | None:
        """The newest preview of the subject, when it was made for the points the subject has now."""
        key = box_id or self.subject.box_id
        p = self.previews.get(key)
        return p if p is not None and list(p.points) == self.decision(key).points else None

    def keep_preview(self, preview: Preview) -> bool:
        """Keep ``preview`` unless it is for points the subject no longer has (a later click's answer
        may have come first)."""
        have = self.decision(preview.box_id).points
        if list(preview.points) != have[: len(preview.points)]:
            return False
        old = self.previews.get(preview.box_id)
        if old is not None and len(old.points) > len(preview.points) and list(old.points) == have[: len(old.points)]:
            return False
        self.previews[preview.box_id] = preview
        return True

    def problems(self) -> list[str]:
        """What is still missing before the decisions can be sent, one line per subject."""
        out = []
        for s in self.panel.subjects:
            why = self.decision(s.box_id).problem()
            if why:
                out.append(f"{s.name}: {why}")
        return out

    @property
    def complete(self) -> bool:
        return not self.problems()

    def payload(self) -> list[dict[str, Any]]:
        """The ``decisions`` of the intervention: one per listed subject, in the pause's order."""
        out = []
        for s in self.panel.subjects:
            d = self.decision(s.box_id)
            if d.kind is None:
                raise ValueError(f"{s.name} has no decision")
            out.append(
                {
                    "box_id": s.box_id,
                    "decision": d.kind,
                    "reason": d.reason.strip() if d.kind == "REJECT" else None,
                    "points": [p.to_json() for p in d.points] if d.kind == "REFINE" else [],
                }
            )
        return out

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = dict.fromkeys(KINDS, 0)
        for s in self.panel.subjects:
            kind = self.decision(s.box_id).kind
            if kind is not None:
                out[kind] += 1
        return out


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


# --------------------------------------------------------------------------- decisions that still apply


def applies(subject: MaskSubject, d: Decision, mask_url: str | None, bbox: Iterable[float] | None) -> Decision | None:
    """``d`` (made when the subject showed ``mask_url`` in ``bbox``) as it still applies to ``subject``."""
    same_box = bbox is not None and [round(float(v), 1) for v in bbox] == [round(v, 1) for v in subject.bbox]
    if d.kind in ("ACCEPT", "REJECT"):
        return Decision(d.kind, d.reason, list(d.points) if same_box else []) if mask_url == subject.mask_url else None
    if d.points and same_box:
        return Decision(d.kind, d.reason, list(d.points))
    return None


def carry_over(old: MaskReview, panel: MaskPanel) -> tuple[MaskReview, list[str], list[str]]:
    """A review of ``panel`` with ``old``'s decisions that still apply; the subjects whose decision was
    kept and those whose was not (by name), for the banner."""
    made = {
        box_id: (d, s.mask_url, s.bbox)
        for box_id, d in old.decisions.items()
        if (s := old.panel.by_id(box_id)) is not None and (d.kind is not None or d.points)
    }
    return _rebuilt(panel, made, current=old.subject.box_id)


def _rebuilt(
    panel: MaskPanel, made: Mapping[str, tuple[Decision, str | None, Iterable[float] | None]], current: str | None
) -> tuple[MaskReview, list[str], list[str]]:
    review = MaskReview(panel)
    kept, dropped = [], []
    for box_id, (d, mask_url, bbox) in made.items():
        s = panel.by_id(box_id)
        now = applies(s, d, mask_url, bbox) if s is not None else None
        if s is not None and now is not None:
            review.decisions[box_id] = now
            kept.append(s.name)
        else:
            dropped.append(s.name if s is not None else box_id)
    if current is not None:
        review.show(current)
    return review, kept, dropped


def carried_text(kept: list[str], dropped: list[str], *, restored: bool = False) -> str:
    parts = []
    if kept:
        verb = "were restored from this browser" if restored else "were kept"
        parts.append(f"Your decisions on {', '.join(kept)} {verb}.")
    if dropped:
        parts.append(f"Not kept (the mask changed, or the subject is no longer listed): {', '.join(dropped)}.")
    return " ".join(parts)


# --------------------------------------------------------------------------- drafts kept by the browser


def draft_message(review: MaskReview | None, panel: MaskPanel, *, forget: bool = False) -> str:
    """What the browser keeps (or forgets) of a mask review: the same message as a box stage's draft
    (``ui.assets.SAVE_DRAFT_JS`` stores it), under a key of its own."""
    body: dict[str, Any] = {
        "key": f"{DRAFT_PREFIX}{panel.job_id}:{panel.pause_token}",
        "job_id": panel.job_id,
        "pause_token": panel.pause_token,
        "draft": None,
    }
    if review is not None and not forget:
        made = {}
        for box_id, d in review.decisions.items():
            s = panel.by_id(box_id)
            if s is None or (d.kind is None and not d.points and not d.reason):
                continue
            made[box_id] = {
                "decision": d.kind,
                "reason": d.reason,
                "points": [p.to_json() for p in d.points],
                "mask_url": s.mask_url,
                "bbox": list(s.bbox),
            }
        body["draft"] = {"decisions": made} if made else None
    return json.dumps(body, sort_keys=True)


def restore_draft(raw: str | None, panel: MaskPanel) -> tuple[MaskReview, list[str], list[str]] | None:
    """The review the browser kept for ``panel`` (its job and pause), or None: absent, another pause's,
    or malformed (it comes from the browser, so it is checked like any input)."""
    if not raw:
        return None
    try:
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("job_id") != panel.job_id:
            return None
        if body.get("pause_token") != panel.pause_token:
            return None
        made: dict[str, tuple[Decision, str | None, Iterable[float] | None]] = {}
        for box_id, item in ((body.get("draft") or {}).get("decisions") or {}).items():
            kind = item.get("decision")
            if kind is not None and kind not in KINDS:
                raise ValueError("unknown decision")
            points = [Point(float(p["x"]), float(p["y"]), bool(p["positive"])) for p in item.get("points") or []]
            reason = str(item.get("reason") or "")[:MAX_REASON]
            made[str(box_id)] = (Decision(kind, reason, points[:MAX_POINTS]), item.get("mask_url"), item.get("bbox"))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not made:
        return None
    return _rebuilt(panel, made, current=None)


# --------------------------------------------------------------------------- in words


def quality_md(quality: QualityVerdict | None, *, heading: str = "The quality gate") -> str:
    """The gate's verdict on a mask: the reasons in words, then the scores."""
    if quality is None:
        return f"**{heading}:** no verdict (the gate is off)."
    lines = [f"**{heading}: {quality.verdict}** (policy `{quality.policy}`)"]
    if quality.verdict == "FAIL":
        lines += [f"- {r}" for r in quality.reasons] or ["- no reason given"]
    if quality.scores:
        lines.append("\nScores: " + " · ".join(f"{k} {v:.2f}" for k, v in sorted(quality.scores.items())))
    return "\n".join(lines)


def subject_md(review: MaskReview) -> str:
    """What the panel says about the subject shown: its verdict, and the preview of the reviewer's points."""
    s = review.subject
    d = review.decision()
    parts = [f"**{s.name}** · `{s.box_id}` · {KIND_WORDS.get(d.kind or '', 'no decision yet')}"]
    if d.kind == "REFINE":
        p = review.preview()
        if not d.points:
            parts.append(
                "Click the image to add points: a click marks the subject, Shift-click or right-click marks what "
                "is not the subject. Each click shows a preview of the new mask."
            )
        elif p is not None:
            took = f", {p.ms:.0f} ms" if p.ms is not None else ""
            parts.append(quality_md(p.quality, heading=f"Preview of your {len(d.points)} point(s) ({p.area} px{took})"))
        else:
            parts.append(f"Your {len(d.points)} point(s) are shown; the preview of them is not here (yet).")
    blind = s.quality is None and s.reason  # no verdict to show: say why (statecore.mask_review, gate_spot)
    parts.append(f"**The quality gate:** {s.reason}" if blind else quality_md(s.quality))
    return "\n\n".join(parts)


def subject_choices(review: MaskReview) -> list[tuple[str, str]]:
    """The subject list: name, the gate's verdict and the decision so far, for each listed subject."""
    out = []
    for s in review.panel.subjects:
        verdict = s.quality.verdict if s.quality is not None else "no verdict"
        out.append((f"{s.name} — gate {verdict} — {review.decision(s.box_id).words()}", s.box_id))
    return out


def summary_md(review: MaskReview) -> str:
    n = len(review.panel.subjects)
    done = n - len(review.problems())
    head = f"**{done} of {n} decided.**"
    if review.complete:
        return head + " Submit sends every decision at once (Enter)."
    return head + " Still needed: " + "; ".join(review.problems()) + "."


def stage_md(panel: MaskPanel) -> str:
    n = len(panel.subjects)
    return (
        f"### {MASK_STAGE_TEXT}\n{n} subject{'s' if n != 1 else ''} to decide · `{MASK_STAGE}` · "
        f"pause `{panel.pause_token}` · snapshot `{panel.snapshot_id[:13]}`"
    )


NEXT_WORDS = {
    "PROCESS_APPROVED_BOX_LIST": "cutting out the subjects to refine again, with your points",
    "FINALIZE_RESULTS": "putting the results together",
}


def submitted_text(
    counts: Mapping[str, int], status: str, next_node_type: str | None, quorum: Mapping[str, Any] | None = None
) -> str:
    said = ", ".join(f"{counts.get(k, 0)} {w}" for k, w in (("ACCEPT", "accepted"), ("REJECT", "rejected")))
    said += f", {counts.get('REFINE', 0)} to refine"
    if quorum and quorum.get("outcome") == "VOTE_RECORDED":  # docs/protocol.md § Quorum
        got, of = quorum.get("received"), quorum.get("invited") or quorum.get("needed")  # all N, or a majority's N
        return f"Decisions recorded — {said}: {got} of {of} reviewers. The job moves on once theirs agree."
    nxt = NEXT_WORDS.get(next_node_type or "", "nothing more: the job has ended")
    return f"Decisions submitted — {said}. The job is now {status}; next: {nxt}."


def conflict_text(code: str, already_ours: bool, fallback: str) -> str:
    """A 409 of a mask review in words (the box stages' words where they fit: ``fallback``)."""
    if code == "SNAPSHOT_MISMATCH":
        return "Your view was out of date: the cut-outs waiting now are not the ones you reviewed."
    if code == "IDEMPOTENCY_CONFLICT":
        return "This review was already submitted with different decisions."
    if code == "VERSION_CONFLICT":
        who = "this review was already submitted" if already_ours else "the job changed after you opened it"
        return f"Your view was out of date: {who}."
    return fallback
