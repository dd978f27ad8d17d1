"""The box list's handlers and their wiring (``ui.app.build_app`` calls ``wire_box_list``).

The list follows the canvas: every value the annotator reports (an edit, or a value the app put
there: a redraw, undo, a label) redraws it, as does the score slider. Hide and Lock are kept per
review in ``ReviewerState.box_list`` (a ``ui.box_list.BoxListState``, fresh for each pause).
Selecting, Tab and the arrow keys never come here: they act on the canvas in the page
(``ui.box_list_assets``), and a nudge reaches the app as an ordinary edit of the canvas.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from .annotator import read_annotator
from .box_list import BoxListState, box_rows, render_list, state_for
from .box_list_assets import BOX_LIST_JS
from .layout import Components
from .panel import Panel
from .session import ReviewerState

Update = dict[Any, Any]


class BoxListView:
    """Handlers of the box list; ``c`` is the page's components."""

    def __init__(self, c: Components) -> None:
        self.c = c

    def _state(self, st: ReviewerState, panel: Panel) -> BoxListState:
        state = state_for(st.box_list, panel.pause_token)
        st.box_list = state
        return state

    def _render(self, st: ReviewerState, value: Any, min_score: float | None) -> Update:
        panel = st.panel_for(value) if value else None
        if panel is None or panel is not st.panel:  # no review, or a value drawn for one that is over
            return {self.c.box_list.html: "" if st.panel is None else gr.skip()}
        rows = box_rows(panel, read_annotator(panel, value), st.relabels, self._state(st, panel), min_score)
        return {self.c.box_list.html: render_list(panel, rows)}

    def on_canvas(self, st: ReviewerState, value: Any, min_score: float | None) -> Update:
        """The canvas reported a value, or the score filter moved: the list again."""
        with st.lock:
            return self._render(st, value, min_score)

    def on_act(self, st: ReviewerState, value: Any, min_score: float | None, evt: gr.EventData) -> Update:
        """Hide/Show or Lock/Unlock on a row (``{"act", "box_id"}`` from the page)."""
        data = evt._data if isinstance(getattr(evt, "_data", None), dict) else {}
        act, box_id = str(data.get("act") or ""), str(data.get("box_id") or "")
        with st.lock:
            panel = st.panel_for(value) if value else None
            pb = panel.by_id(box_id) if panel is not None and panel is st.panel else None
            if panel is None or pb is None:
                return {self.c.box_list.html: gr.skip()}
            self._state(st, panel).toggle(act, box_id, pb.box.score, float(min_score or 0.0))
            return self._render(st, value, min_score)


def wire_box_list(demo: gr.Blocks, c: Components, view: BoxListView) -> None:
    """Connect the list (inside ``demo``'s context; after ``ui.app.wire``, whose canvas listener draws the
    list with each value the annotator reports, ``BoxListView.on_canvas``)."""
    b = c.box_list
    inputs = [c.session, c.annotator, b.min_score]
    demo.load(None, js=BOX_LIST_JS)
    # preprocess=False: the annotator's raw value (ui.annotator reads it without decoding the image).
    b.min_score.change(view.on_canvas, inputs=inputs, outputs=b.outputs(), preprocess=False, show_progress="hidden")
    b.html.click(
        view.on_act,
        inputs=inputs,
        outputs=b.outputs(),
        preprocess=False,
        show_progress="hidden",
        trigger_mode="multiple",
    )
