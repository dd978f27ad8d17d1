"""The interactive box list beside the canvas: its rows, what the reviewer hid or locked, the score filter.

Why an HTML list driven by a small script (``ui.box_list_assets``) and not a ``gr.Dataframe`` with
select events: a row click must select the box *inside the canvas*, whose selection lives in
``gradio_image_annotation``'s JavaScript; a Dataframe select would go to the server and back before
the canvas could be told, and a Dataframe has no per-row buttons with their own accessible names
and pressed states. The list is rendered here as HTML (one ``<li>`` per box, buttons carrying
``data-act``); a click on a row is handled in the page at once, Hide and Lock go to the server
(``gr.HTML``'s ``trigger``) because what is hidden and locked belongs to the review and decides the
note shown beside it. The rendered list carries, in ``data-flags``, which boxes the canvas must not
draw (hidden), must not let move (locked) and draws dashed (low score); the page's script reads it.

What the component allows: a box is only ``xmin/ymin/xmax/ymax``, ``label`` and ``color`` (no
per-box visibility, lock or line style), so hiding, locking and dashing are done by the page's
script around the canvas' own box class (see ``ui.box_list_assets``). A hidden box stays in the
annotator's value, so it is submitted as kept unless deleted; the page says so.

Only the boxes of the panel (tag ``#n``) can be hidden or locked: a box drawn by the reviewer has
no identity that survives an edit (it is known by its place in the canvas' list only).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .annotator import DrawnBox, new_box_numbers
from .panel import Panel

LOW_SCORE = 0.5  # a model box scoring below this is drawn dashed and marked in the list
HIDDEN_RULE = "Hidden boxes are not drawn, but they are still submitted as kept — delete a box to drop it."


@dataclass
class BoxListState:
    """What the reviewer hid and locked in one review (one pause), by box id."""

    pause_token: str
    hidden: set[str] = field(default_factory=set)  # hidden by the reviewer
    shown: set[str] = field(default_factory=set)  # shown by the reviewer although below the score filter
    locked: set[str] = field(default_factory=set)

    def is_hidden(self, box_id: str, score: float | None, min_score: float) -> bool:
        if box_id in self.hidden:
            return True
        return below_filter(score, min_score) and box_id not in self.shown

    def toggle(self, act: str, box_id: str, score: float | None, min_score: float) -> bool:
        """Flip a box's visibility (``hide``) or lock (``lock``); False for anything else."""
        if act == "hide":
            if self.is_hidden(box_id, score, min_score):
                self.hidden.discard(box_id)
                if below_filter(score, min_score):
                    self.shown.add(box_id)
            else:
                self.hidden.add(box_id)
                self.shown.discard(box_id)
            return True
        if act == "lock":
            self.locked.symmetric_difference_update({box_id})
            return True
        return False


def state_for(current: BoxListState | None, pause_token: str) -> BoxListState:
    """The review's state: ``current`` while it is the same pause, else a fresh one."""
    if current is None or current.pause_token != pause_token:
        return BoxListState(pause_token)
    return current


def below_filter(score: float | None, min_score: float | None) -> bool:
    """Hidden by the score slider: a scored box below it (hand-drawn boxes have no score)."""
    return score is not None and min_score is not None and score < float(min_score)


def is_low(score: float | None, threshold: float = LOW_SCORE) -> bool:
    return score is not None and score < threshold


@dataclass(frozen=True)
class BoxRow:
    """One row of the list: a box on the canvas now."""

    tag: int | None  # the panel box's ``#n`` (None: drawn by the reviewer)
    new_number: int | None  # a drawn box's number, oldest = 1
    box_id: str | None
    label: str | None
    score: float | None
    source: str  # "model", "manual" or "drawn" (by this reviewer, not submitted yet)
    problem: str | None = None  # the validator's reason, for a box sent back in round 2
    moved: bool = False
    relabelled: bool = False
    low: bool = False
    below: bool = False
    hidden: bool = False
    locked: bool = False

    @property
    def name(self) -> str:
        return f"#{self.tag}" if self.tag is not None else f"new box {self.new_number}"

    @property
    def title(self) -> str:
        return f"{self.name} {self.label or '(no label)'}"


def box_rows(
    panel: Panel,
    drawn: list[DrawnBox],
    relabels: dict[str, str] | None = None,
    state: BoxListState | None = None,
    min_score: float | None = 0.0,
) -> list[BoxRow]:
    """The rows for what the canvas holds: the panel's boxes by tag, then drawn boxes oldest first."""
    relabels = relabels or {}
    state = state or BoxListState(panel.pause_token)
    floor = float(min_score or 0.0)
    rows: list[BoxRow] = []
    for d in sorted((d for d in drawn if d.source is not None), key=lambda d: d.source.tag if d.source else 0):
        pb = d.source
        assert pb is not None
        b = pb.box
        label = relabels.get(pb.box_id, b.label)
        rows.append(
            BoxRow(
                tag=pb.tag,
                new_number=None,
                box_id=pb.box_id,
                label=label,
                score=b.score,
                source=b.source,
                problem=(pb.reason or "needs revision") if pb.problem else None,
                moved=d.bbox is not None and tuple(d.bbox) != tuple(b.bbox),
                relabelled=label != b.label,
                low=is_low(b.score),
                below=below_filter(b.score, floor),
                hidden=state.is_hidden(pb.box_id, b.score, floor),
                locked=pb.box_id in state.locked,
            )
        )
    numbers = new_box_numbers(drawn)
    for d in sorted((d for d in drawn if d.source is None), key=lambda d: numbers[d.index]):
        rows.append(
            BoxRow(tag=None, new_number=numbers[d.index], box_id=None, label=d.new_label, score=None, source="drawn")
        )
    return rows


def canvas_flags(panel: Panel, rows: Iterable[BoxRow]) -> dict[str, Any]:
    """What the page's script needs: the image size (for nudges) and the tags hidden, locked and low."""
    rows = list(rows)
    return {
        "key": f"{panel.job_id}|{panel.pause_token}",
        "w": panel.image.width,
        "h": panel.image.height,
        "hidden": [r.tag for r in rows if r.tag is not None and r.hidden],
        "locked": [r.tag for r in rows if r.tag is not None and r.locked],
        "low": [r.tag for r in rows if r.tag is not None and r.low],
    }


def hidden_note(rows: Iterable[BoxRow]) -> str:
    """The line above the list: how many boxes are hidden, and that they are still submitted."""
    hidden = [r for r in rows if r.hidden]
    if not hidden:
        return "Click a box to select it on the image."
    by_filter = sum(1 for r in hidden if r.below)
    why = f" ({by_filter} below the score filter)" if by_filter else ""
    n = len(hidden)
    return f"{n} box{'es' if n != 1 else ''} hidden{why}. {HIDDEN_RULE}"


# --------------------------------------------------------------------------- the HTML


def _badges(r: BoxRow) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if r.problem:
        out.append(("problem", f"did not pass naming: {r.problem}"))
    if r.low:
        out.append(("low", "low score"))
    if r.hidden:
        out.append(("hidden", "hidden, below the score filter" if r.below else "hidden"))
    if r.locked:
        out.append(("locked", "locked"))
    if r.moved:
        out.append(("edited", "moved"))
    if r.relabelled:
        out.append(("edited", "relabelled"))
    if r.source == "drawn" and not r.label:
        out.append(("problem", "needs a label"))
    return out


def _row_html(r: BoxRow) -> str:
    e = html.escape
    classes = ["hbl-row"] + [
        c for c, on in (("hbl-low", r.low), ("hbl-hidden", r.hidden), ("hbl-locked", r.locked)) if on
    ]
    attrs = f'data-row="1" data-tag="{r.tag}" data-box="{e(r.box_id or "")}"' if r.tag is not None else ""
    if r.tag is None:
        attrs = f'data-row="1" data-new="{r.new_number}"'
    meta = " · ".join(p for p in (f"{r.score:.2f}" if r.score is not None else "", r.source) if p)
    badges = "".join(f'<span class="hbl-badge hbl-{c}">{e(text)}</span>' for c, text in _badges(r))
    pick_name = f"Select {r.title} on the image" if not r.hidden else f"{r.title} is hidden: show it to select it"
    pick = (
        f'<button type="button" class="hbl-pick" data-act="pick" aria-pressed="false" aria-label="{e(pick_name)}"'
        f'{" disabled" if r.hidden else ""}><span class="hbl-name">{e(r.title)}</span> '
        f'<span class="hbl-meta">{e(meta)}</span> {badges}</button>'
    )
    tools = ""
    if r.tag is not None:
        hide_word, lock_word = ("Show" if r.hidden else "Hide"), ("Unlock" if r.locked else "Lock")
        tools = (
            f'<button type="button" class="hbl-tool" data-act="hide" aria-pressed="{str(r.hidden).lower()}" '
            f'aria-label="{e(f"{hide_word} {r.title}")}">{hide_word}</button>'
            f'<button type="button" class="hbl-tool" data-act="lock" aria-pressed="{str(r.locked).lower()}" '
            f'aria-label="{e(f"{lock_word} {r.title}")}">{lock_word}</button>'
        )
    return f'<li class="{" ".join(classes)}" {attrs}>{pick}{tools}</li>'


def render_list(panel: Panel | None, rows: list[BoxRow]) -> str:
    """The list as HTML (``ui.box_list_layout``'s ``gr.HTML``), with the canvas' flags in ``data-flags``."""
    if panel is None:
        return ""
    flags = html.escape(json.dumps(canvas_flags(panel, rows), sort_keys=True), quote=True)
    body = "".join(_row_html(r) for r in rows) or '<li class="hbl-empty">No boxes on the image.</li>'
    return (
        f'<div class="hitl-box-list" data-flags="{flags}">'
        f'<p class="hbl-summary">{html.escape(hidden_note(rows))}</p>'
        f'<ul class="hbl-rows" aria-label="Boxes on the image">{body}</ul>'
        '<p class="hbl-status" role="status" aria-live="polite"></p></div>'
    )
