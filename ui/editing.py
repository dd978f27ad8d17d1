"""The editor's handlers: label buttons and number keys, undo/redo, reset, and drafts kept by the browser.

A mixin of ``ui.callbacks.Callbacks``. Every state the canvas shows is an ``Edits`` over the panel
(``ui.annotator``), so undo, redo, reset and a restored draft are each one ``reapplied_value``; the
browser keeps the newest state in localStorage under the job and pause (``ui.editor.draft_key``)
and sends it back when that same review is drawn again (a reload, a crashed tab).
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from .annotator import (
    AUTO_TARGET,
    Edits,
    applicable_edits,
    apply_label,
    box_notes,
    edits_between,
    label_choices,
    new_box_numbers,
    raw_boxes,
    read_annotator,
    reapplied_value,
)
from .editor import draft_message, parse_draft
from .images import ImageStore
from .layout import Components
from .panel import Panel
from .session import ReviewerState

Update = dict[Any, Any]
NO_SELECTION = "Select a box first: press D, click the box on the image, then press its number key."


def selected_index(value: Any, picked: dict[str, Any] | None) -> int | None:
    """The annotator index of the box the browser says is selected (same caption and corners).

    The browser's copy of the box can be one redraw old (a label just set), so a box at the same
    corners is taken when the caption differs; None when no box is there any more.
    """
    if not picked:
        return None
    scale = float(picked.get("scaleFactor") or 1.0)
    try:
        want = [float(picked[k]) / scale for k in ("xmin", "ymin", "xmax", "ymax")]
    except (KeyError, TypeError, ValueError):
        return None
    same_place = []
    for i, raw in enumerate(raw_boxes(value)):
        s = float(raw.get("scaleFactor") or 1.0)
        have = [float(raw[k]) / s for k in ("xmin", "ymin", "xmax", "ymax")]
        if all(abs(a - b) <= 1.0 for a, b in zip(want, have, strict=True)):
            if str(raw.get("label") or "") == str(picked.get("label") or ""):
                return i
            same_place.append(i)
    return same_place[0] if len(same_place) == 1 else None


def target_of(panel: Panel, value: Any, index: int) -> str:
    """The ``label_choices`` value naming the annotator box at ``index``."""
    drawn = read_annotator(panel, value)
    d = drawn[index]
    if d.source is not None:
        return f"box:{d.source.box_id}"
    return f"new:{new_box_numbers(drawn)[d.index]}"


class EditorHandlers:
    """Handlers of the editing controls; ``Callbacks`` provides ``c``, ``store`` and ``labels``."""

    c: Components
    store: ImageStore
    labels: tuple[str, ...]

    def editor_view(self, st: ReviewerState, panel: Panel, value: Any, *, changed: bool) -> Update:
        """Notes, label choices and undo/redo for the canvas value ``value``; the draft when it changed."""
        c = self.c
        hist = st.history_for(panel)
        drawn = read_annotator(panel, value)
        out: Update = {
            c.notes_md: box_notes(panel, drawn, st.relabels),
            c.undo_btn: gr.update(interactive=hist.can_undo, value=c.undo_btn.value),  # text resent: see Callbacks.view
            c.redo_btn: gr.update(interactive=hist.can_redo, value=c.redo_btn.value),
        }
        if changed:
            out[c.draft_out] = draft_message(panel.job_id, panel.pause_token, hist.current)
        return out

    def show_edits(self, st: ReviewerState, panel: Panel, edits: Edits, replaced: Edits | None = None) -> Update:
        """Put ``edits`` (over ``panel``) on the canvas in place of ``replaced`` (``ReviewerState.shown_by_app``);
        the caller holds ``st.lock``."""
        value, st.relabels = reapplied_value(panel, edits, self.store.for_panel(st, panel))
        st.shown_by_app(panel, edits, replaced)
        out = {self.c.annotator: value, self.c.review_error: ""}
        out.update(self.editor_view(st, panel, value, changed=True))
        out[self.c.label_target] = gr.update(choices=label_choices(panel, read_annotator(panel, value), st.relabels))
        return out

    def _open_panel(self, st: ReviewerState) -> Panel | None:
        return st.panel if st.panel is not None and st.image_path else None

    def on_annotator_change(self, st: ReviewerState, value: Any, target: str | None) -> Update:
        with st.lock:
            panel = st.panel_for(value)
            if panel is None or not value:
                return {self.c.notes_md: gr.skip()}
            drawn = read_annotator(panel, value)
            if panel is st.panel:
                edits = edits_between(panel, drawn, st.relabels)
                changed = st.canvas_changed(panel, edits)
                if not changed and edits != st.history_for(panel).current:
                    # A late echo of a state the app has since replaced: the canvas shows the newer one.
                    return {self.c.notes_md: gr.skip()}
            choices = label_choices(panel, drawn, st.relabels)
            keep = target if target in {v for _, v in choices} else AUTO_TARGET
            out: Update = {self.c.label_target: gr.update(choices=choices, value=keep)}
            if panel is not st.panel:  # drawn for a review that is over: notes only
                out[self.c.notes_md] = box_notes(panel, drawn, st.relabels)
                return out
            out.update(self.editor_view(st, panel, value, changed=changed))
            return out

    def seen(self, st: ReviewerState, panel: Panel, value: Any, relabels: dict[str, str] | None = None) -> None:
        """Record the canvas state ``value`` an event was sent with (``relabels``: the labels it was drawn
        with, default the current ones) before the event acts on it. A label key or Undo pressed right after
        drawing can overtake the canvas's own report of the drawing; the report, arriving afterwards, is then
        an older state and ignored, instead of taking the label away or undoing the wrong step."""
        if value and st.panel_for(value) is panel:
            drawn = read_annotator(panel, value)
            st.canvas_changed(panel, edits_between(panel, drawn, st.relabels if relabels is None else relabels))

    def on_undo(self, st: ReviewerState, value: Any) -> Update:
        return self._travel(st, value, back=True)

    def on_redo(self, st: ReviewerState, value: Any) -> Update:
        return self._travel(st, value, back=False)

    def _travel(self, st: ReviewerState, value: Any, *, back: bool) -> Update:
        """Undo (``back``) or redo from the canvas state ``value`` the event was sent with."""
        btn = self.c.undo_btn if back else self.c.redo_btn
        with st.lock:
            panel = self._open_panel(st)
            if panel is not None:
                self.seen(st, panel, value)  # a drawing not yet reported: undone first, nothing left to redo
                hist = st.history_for(panel)
                was = hist.current
                edits = hist.undo() if back else hist.redo()
                if edits is not None:
                    return self.show_edits(st, panel, edits, replaced=was)
            return {btn: gr.update(interactive=False, value=btn.value)}

    def on_reset(self, st: ReviewerState, value: Any) -> Update:
        """Back to the boxes the model (or the previous round) offered; undoable (to what was on the canvas)."""
        with st.lock:
            panel = self._open_panel(st)
            if panel is None:
                return {self.c.review_error: gr.skip()}
            self.seen(st, panel, value)
            return self.show_edits(st, panel, Edits())

    def on_pick_label(self, st: ReviewerState, value: Any, pick: str | None) -> Update:
        """A label button (or its number key): the selected box gets that label."""
        try:
            data = json.loads(pick or "{}")
            label = self.labels[int(data["label"]) - 1]
        except (ValueError, KeyError, IndexError, TypeError):
            return {self.c.review_error: gr.skip()}
        with st.lock:
            panel = st.panel_for(value)
            if panel is None or panel is not st.panel or not st.image_path:
                return {self.c.review_error: "No review is open."}
            picked = data.get("box") if isinstance(data.get("box"), dict) else None
            index = selected_index(value, picked)
            if picked is not None and index is None:
                return {self.c.review_error: "The selected box is no longer on the image. " + NO_SELECTION}
            target = target_of(panel, value, index) if index is not None else AUTO_TARGET
            if index is None and not any(d.source is None and not d.new_label for d in read_annotator(panel, value)):
                return {self.c.review_error: NO_SELECTION}
            image = self.store.for_panel(st, panel)
            new_value, relabels, err = apply_label(panel, value, st.relabels, target, label, image)
            if err or new_value is None:
                return {self.c.review_error: err or NO_SELECTION}
            before, st.relabels = st.relabels, relabels
            return self._after_label(st, panel, value, new_value, before)

    def _after_label(
        self, st: ReviewerState, panel: Panel, value: Any, new_value: Any, before: dict[str, str]
    ) -> Update:
        self.seen(st, panel, value, before)  # the state the label was applied to (a drawing not yet reported)
        edits = edits_between(panel, read_annotator(panel, new_value), st.relabels)
        st.shown_by_app(panel, edits)
        out: Update = {self.c.annotator: new_value, self.c.review_error: "", self.c.label_text: ""}
        out.update(self.editor_view(st, panel, new_value, changed=True))
        out[self.c.label_target] = gr.update(
            choices=label_choices(panel, read_annotator(panel, new_value), st.relabels), value=AUTO_TARGET
        )
        return out

    def on_apply_label(self, st: ReviewerState, value: Any, target: str | None, text: str) -> Update:
        """The free-text label field (for a label outside the configured set)."""
        with st.lock:
            panel = st.panel_for(value)
            image = self.store.for_panel(st, panel) if panel is not None and st.image_path else None
            new_value, relabels, err = apply_label(panel, value, st.relabels, target, text, image)
            if err or new_value is None or panel is None:
                return {self.c.review_error: err}
            before, st.relabels = st.relabels, relabels
            if panel is not st.panel:
                return {self.c.annotator: new_value, self.c.label_text: "", self.c.review_error: ""}
            return self._after_label(st, panel, value, new_value, before)

    def on_restore_draft(self, st: ReviewerState, raw: str | None) -> Update:
        """The browser's kept edits for the review just drawn: put back where their boxes still exist."""
        with st.lock:
            panel = self._open_panel(st)
            edits = parse_draft(raw, panel.job_id, panel.pause_token) if panel is not None else None
            if panel is None or edits is None or st.offer is not None or st.history_for(panel).can_undo:
                return {self.c.review_error: gr.skip()}
            keep, dropped = applicable_edits(panel, edits)
            if keep.is_empty():
                return {self.c.review_error: gr.skip()}
            out = self.show_edits(st, panel, keep)
            st.notice = f"Restored your unsent edits from this browser ({keep.describe()})." + (
                f" Not restorable (box gone): {', '.join(dropped)}." if dropped else ""
            )
            out[self.c.banner_md] = st.notice
            return out
