"""The editor's pure parts: the configured label set and its number keys, the undo stack of box
edits, the draft a browser keeps of unsent edits, and the stages' names in words.

No Gradio and no I/O here, so each rule is tested on its own (tests/test_editor_units.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .annotator import MAX_LABEL, Edits

LABELS_ENV = "HITL_LABELS"
MAX_LABELS = 24  # buttons beyond this would not fit the row; the free-text field takes the rest
HOTKEYS = 9  # keys 1–9 set the selected box's label to the first nine labels
HISTORY_DEPTH = 200  # undo steps kept per review; the oldest go first
DRAFT_PREFIX = "hitl-draft:"

# Stage names a reviewer reads (the queue, its filter, the stats); the raw names stay in the API.
STAGE_NAMES = {
    "WAITING_USER_SELECTION": "Confirm boxes (round 1)",
    "WAITING_BOX_BATCH_REVISION": "Fix rejected boxes (round 2)",
    "WAITING_MASK_REVIEW": "Review cut-outs",
}
ALL_STAGES = "all"


def stage_name(stage: str | None) -> str:
    """A waiting stage in words; an unknown stage keeps its raw name rather than vanish."""
    if not stage:
        return ""
    return STAGE_NAMES.get(stage, stage.replace("_", " ").capitalize())


def stage_choices() -> list[tuple[str, str]]:
    """Choices of the queue's stage filter: (words, raw stage)."""
    return [("All stages", ALL_STAGES), *((name, stage) for stage, name in STAGE_NAMES.items())]


# --------------------------------------------------------------------------- the label set


def parse_labels(raw: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"shoe, bag,,shirt"`` (or a list) → ``("shoe", "bag", "shirt")``: trimmed, blanks and
    repeats dropped (first one wins, case-insensitively), at most ``MAX_LABELS``."""
    if raw is None:
        return ()
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    out: list[str] = []
    seen: set[str] = set()
    for item in items:
        label = " ".join(str(item).split())
        if not label or label.casefold() in seen:
            continue
        if len(label) > MAX_LABEL:
            raise ValueError(f"label {label[:20]!r}… is longer than {MAX_LABEL} characters")
        seen.add(label.casefold())
        out.append(label)
    if len(out) > MAX_LABELS:
        raise ValueError(f"{len(out)} labels configured; at most {MAX_LABELS} fit on the page")
    return tuple(out)


def labels_from_env() -> tuple[str, ...]:
    return parse_labels(os.environ.get(LABELS_ENV))


def hotkey_for(index: int) -> str | None:
    """The number key of the label at ``index`` (0-based), or None past the ninth."""
    return str(index + 1) if 0 <= index < HOTKEYS else None


def label_for_key(labels: tuple[str, ...], key: str) -> str | None:
    """The label a number key sets (``"1"`` → the first label), or None."""
    if len(key) != 1 or not key.isdigit() or key == "0":
        return None
    i = int(key) - 1
    return labels[i] if i < min(len(labels), HOTKEYS) else None


def button_text(labels: tuple[str, ...], index: int) -> str:
    key = hotkey_for(index)
    return f"{key} · {labels[index]}" if key else labels[index]


# --------------------------------------------------------------------------- undo / redo


def copy_edits(ed: Edits) -> Edits:
    return Edits(
        deleted=list(ed.deleted),
        moved=dict(ed.moved),
        relabelled=dict(ed.relabelled),
        added=list(ed.added),
    )


@dataclass
class EditHistory:
    """The states a review went through, as edits over the panel it answers (one pause).

    ``record`` pushes a new state when it differs from the current one (a click that only
    selected a box changes nothing) and drops whatever could be redone; ``undo``/``redo``
    move along the states and return the one to show. The first state is the panel as the
    model (or the previous round) offered it.
    """

    pause_token: str
    states: list[Edits] = field(default_factory=lambda: [Edits()])
    pos: int = 0

    @property
    def current(self) -> Edits:
        return self.states[self.pos]

    @property
    def can_undo(self) -> bool:
        return self.pos > 0

    @property
    def can_redo(self) -> bool:
        return self.pos < len(self.states) - 1

    def record(self, edits: Edits) -> bool:
        if edits == self.current:
            return False
        del self.states[self.pos + 1 :]
        self.states.append(copy_edits(edits))
        if len(self.states) > HISTORY_DEPTH:
            del self.states[: len(self.states) - HISTORY_DEPTH]
        self.pos = len(self.states) - 1
        return True

    def undo(self) -> Edits | None:
        if not self.can_undo:
            return None
        self.pos -= 1
        return copy_edits(self.current)

    def redo(self) -> Edits | None:
        if not self.can_redo:
            return None
        self.pos += 1
        return copy_edits(self.current)


# --------------------------------------------------------------------------- drafts kept by the browser


def draft_key(job_id: str, pause_token: str) -> str:
    """The localStorage key of a review's unsent edits: one per job and pause, so a draft is never
    offered to another round of the same job."""
    return f"{DRAFT_PREFIX}{job_id}:{pause_token}"


def edits_to_json(ed: Edits) -> dict[str, Any]:
    return {
        "deleted": list(ed.deleted),
        "moved": {k: list(v) for k, v in ed.moved.items()},
        "relabelled": dict(ed.relabelled),
        "added": [{"bbox": list(b), "label": lbl} for b, lbl in ed.added],
    }


def _bbox(raw: Any) -> tuple[float, float, float, float]:
    if not isinstance(raw, list | tuple) or len(raw) != 4:
        raise ValueError("a bbox is four numbers")
    x1, y1, x2, y2 = (float(v) for v in raw)
    return (x1, y1, x2, y2)


def edits_from_json(data: Any) -> Edits:
    """The inverse of :func:`edits_to_json`; anything malformed raises ``ValueError`` (a draft comes
    from the browser, so it is checked like any input)."""
    if not isinstance(data, dict):
        raise ValueError("a draft is an object")
    added = []
    for item in data.get("added") or []:
        label = item.get("label") if isinstance(item, dict) else None
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL):
            raise ValueError("bad label in a draft")
        added.append((_bbox(item.get("bbox") if isinstance(item, dict) else None), label))
    relabelled = data.get("relabelled") or {}
    moved = data.get("moved") or {}
    deleted = data.get("deleted") or []
    if not (isinstance(relabelled, dict) and isinstance(moved, dict) and isinstance(deleted, list)):
        raise ValueError("malformed draft")
    if any(not isinstance(v, str) or len(v) > MAX_LABEL for v in relabelled.values()):
        raise ValueError("bad label in a draft")
    return Edits(
        deleted=[str(x) for x in deleted],
        moved={str(k): _bbox(v) for k, v in moved.items()},
        relabelled={str(k): v for k, v in relabelled.items()},
        added=added,
    )


def draft_message(job_id: str, pause_token: str, edits: Edits | None) -> str:
    """What the app sends the browser to keep (edits) or forget (``edits`` None or empty) for one review."""
    keep = edits is not None and not edits.is_empty()
    body: dict[str, Any] = {"key": draft_key(job_id, pause_token), "job_id": job_id, "pause_token": pause_token}
    body["draft"] = edits_to_json(edits) if keep and edits is not None else None
    return json.dumps(body, sort_keys=True)


def parse_draft(raw: str | None, job_id: str, pause_token: str) -> Edits | None:
    """A draft the browser sent back for this review, or None (absent, malformed, or another pause's)."""
    if not raw:
        return None
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            return None
        if body.get("job_id") != job_id or body.get("pause_token") != pause_token:
            return None
        edits = edits_from_json(body.get("draft"))
    except (ValueError, TypeError, AttributeError):
        return None
    return None if edits.is_empty() else edits
