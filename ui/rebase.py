"""Rebasing a refused review onto the job's current boxes (docs/protocol.md § Rebase help).

A 409 of the intervention route carries ``rebase``: what changed, box by box, between the box list
the reviewer was shown (its ``base_version``) and the job's box list now (``added``, ``removed``,
``moved``, ``relabelled``, matched by ``box_id``). :func:`rebase_edits` lays the reviewer's own
``Edits`` over the new list: an edit of a box nobody else touched goes on as it was; an edit of a
box someone else moved, relabelled or removed is a *conflict*, left for the reviewer to decide
(the other's version stays on the canvas). Drawn boxes have no id and never conflict; one that
another reviewer already drew at the same place with the same label is not drawn twice.

Pure: no Gradio, no I/O (tests/test_ui_rebase.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hitl_review.statecore.models import Box

from .annotator import Edits

SAME_PLACE_PX = 1.0  # two corners this close are the same place (the canvas rounds to whole pixels)


@dataclass(frozen=True)
class Conflict:
    """One box both the reviewer and someone else changed since the reviewer's base."""

    box_id: str
    mine: str  # what the reviewer did, in words
    theirs: str  # what happened meanwhile, in words

    def describe(self, tag: str | None = None) -> str:
        return f"{tag or self.box_id}: you {self.mine}, but meanwhile it was {self.theirs}"


@dataclass
class RebaseResult:
    """``applied``: the reviewer's edits that go onto the new box list as they are;
    ``conflicts``: the edits that need a decision; ``mine``: those conflicting edits that could still
    be applied (their box still exists), for a "use mine" choice; ``duplicates``: drawn boxes
    someone else already drew."""

    applied: Edits = field(default_factory=Edits)
    conflicts: list[Conflict] = field(default_factory=list)
    mine: Edits = field(default_factory=Edits)
    duplicates: int = 0

    @property
    def clean(self) -> bool:
        return not self.conflicts


def _same_place(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) == 4 and all(abs(float(p) - float(q)) <= SAME_PLACE_PX for p, q in zip(a, b, strict=True))


def _bbox(raw: Any) -> tuple[float, float, float, float] | None:
    try:
        x1, y1, x2, y2 = (float(v) for v in raw)
    except (TypeError, ValueError):
        return None
    return (x1, y1, x2, y2)


@dataclass(frozen=True)
class Changes:
    """The ``rebase`` object of a 409, read defensively (a field missing reads as no change)."""

    found: bool
    added: list[tuple[tuple[float, float, float, float], str | None]]
    removed: set[str]
    moved: dict[str, tuple[float, float, float, float]]
    relabelled: dict[str, str | None]

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> Changes:
        raw = raw or {}
        added = []
        for box in raw.get("added") or []:
            bbox = _bbox(box.get("bbox")) if isinstance(box, Mapping) else None
            if bbox is not None:
                added.append((bbox, box.get("label")))
        removed = {str(b["box_id"]) for b in raw.get("removed") or [] if isinstance(b, Mapping) and "box_id" in b}
        moved: dict[str, tuple[float, float, float, float]] = {}
        for m in raw.get("moved") or []:
            to = _bbox(m.get("to")) if isinstance(m, Mapping) else None
            if to is not None and "box_id" in m:
                moved[str(m["box_id"])] = to
        relabels = [r for r in raw.get("relabelled") or [] if isinstance(r, Mapping) and "box_id" in r]
        relabelled = {str(r["box_id"]): r.get("to") for r in relabels}
        return cls(bool(raw.get("base_found", True)), added, removed, moved, relabelled)


def changes_between(base: Sequence[Box], now: Sequence[Box]) -> dict[str, Any]:
    """The ``rebase`` object for two box lists the page itself saw (the follower redraws a new pause
    before any 409): the same shape as the server's (docs/protocol.md § Rebase help)."""
    old, new = {b.box_id: b for b in base}, {b.box_id: b for b in now}
    both = [k for k in old if k in new]
    return {
        "base_found": True,
        "added": [b.model_dump() for k, b in new.items() if k not in old],
        "removed": [b.model_dump() for k, b in old.items() if k not in new],
        "moved": [
            {"box_id": k, "from": list(old[k].bbox), "to": list(new[k].bbox)}
            for k in both
            if not _same_place(old[k].bbox, new[k].bbox)
        ],
        "relabelled": [
            {"box_id": k, "from": old[k].label, "to": new[k].label} for k in both if old[k].label != new[k].label
        ],
    }


def rebase_edits(edits: Edits, rebase: Mapping[str, Any] | None, current_ids: Iterable[str]) -> RebaseResult:
    """Lay ``edits`` (the reviewer's, over its base) onto the box list whose ids are ``current_ids``,
    knowing what changed meanwhile (``rebase``, as the 409 carries it)."""
    ch = Changes.parse(rebase)
    now = set(current_ids)
    out = RebaseResult()

    def gone(box_id: str) -> bool:
        return box_id in ch.removed or box_id not in now

    for box_id in edits.deleted:
        if gone(box_id):
            continue  # removed meanwhile too: both wanted it gone
        theirs = _their_edit(ch, box_id)
        if theirs:
            out.conflicts.append(Conflict(box_id, "deleted it", theirs))
            out.mine.deleted.append(box_id)
        else:
            out.applied.deleted.append(box_id)
    for box_id, bbox in edits.moved.items():
        if gone(box_id):
            out.conflicts.append(Conflict(box_id, "moved it", "removed"))
        elif box_id in ch.moved and not _same_place(ch.moved[box_id], bbox):
            out.conflicts.append(Conflict(box_id, "moved it", "moved elsewhere"))
            out.mine.moved[box_id] = bbox
        elif box_id not in ch.moved:
            out.applied.moved[box_id] = bbox
    for box_id, label in edits.relabelled.items():
        if gone(box_id):
            out.conflicts.append(Conflict(box_id, f"named it “{label}”", "removed"))
        elif box_id in ch.relabelled and ch.relabelled[box_id] != label:
            out.conflicts.append(Conflict(box_id, f"named it “{label}”", f"named “{ch.relabelled[box_id] or ''}”"))
            out.mine.relabelled[box_id] = label
        elif box_id not in ch.relabelled:
            out.applied.relabelled[box_id] = label
    for bbox, drawn_label in edits.added:
        if any(_same_place(bbox, theirs) and (lbl or None) == (drawn_label or None) for theirs, lbl in ch.added):
            out.duplicates += 1
        else:
            out.applied.added.append((bbox, drawn_label))
    return out


def _their_edit(ch: Changes, box_id: str) -> str:
    what = []
    if box_id in ch.moved:
        what.append("moved")
    if box_id in ch.relabelled:
        what.append(f"named “{ch.relabelled[box_id] or ''}”")
    return " and ".join(what)


def with_mine(result: RebaseResult) -> Edits:
    """The applied edits plus the reviewer's side of every conflict that can still be applied: what the
    canvas shows when the reviewer decides for their own version."""
    both = Edits(
        deleted=[*result.applied.deleted, *result.mine.deleted],
        moved={**result.applied.moved, **result.mine.moved},
        relabelled={**result.applied.relabelled, **result.mine.relabelled},
        added=list(result.applied.added),
    )
    both.moved = {k: v for k, v in both.moved.items() if k not in both.deleted}
    both.relabelled = {k: v for k, v in both.relabelled.items() if k not in both.deleted}
    return both


def rebase_text(result: RebaseResult, tags: Mapping[str, int] | None = None) -> str:
    """The banner's account of a rebase, in words."""
    tags = tags or {}
    parts = []
    if not result.applied.is_empty():
        parts.append(f"Your edits were re-applied onto the current boxes ({result.applied.describe()}).")
    if result.duplicates:
        parts.append(f"{result.duplicates} drawn box(es) were already there and were not drawn twice.")
    if result.conflicts:
        lines = "; ".join(c.describe(f"#{tags[c.box_id]}" if c.box_id in tags else None) for c in result.conflicts)
        parts.append(f"Needs your decision ({len(result.conflicts)}): {lines}. The current version is shown")
        parts[-1] += " — press “Re-apply my edits” to use yours instead." if not result.mine.is_empty() else "."
    return " ".join(parts)
