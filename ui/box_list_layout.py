"""The box list's components (ui.box_list_view): laid out by ``ui.layout`` in the review panel, under
the label field. Why an HTML list and not a Dataframe: see ``ui.box_list``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from .box_list import HIDDEN_RULE
from .box_list_assets import LIST_ON_LOAD_JS


@dataclass(frozen=True)
class BoxListComponents:
    html: gr.HTML  # the rows; a click on a row selects its box on the canvas (ui.box_list_assets)
    min_score: gr.Slider  # boxes scoring below it are hidden (still submitted as kept)

    def outputs(self) -> list[Any]:
        return [self.html]


def box_list_layout() -> BoxListComponents:
    """Lay the list out where it is called (inside ``ui.layout.layout``'s review column)."""
    with gr.Column(elem_id="box-list-panel"):
        min_score = gr.Slider(
            minimum=0.0,
            maximum=1.0,
            step=0.05,
            value=0.0,
            label="Hide boxes scoring below",
            info=HIDDEN_RULE,
            elem_id="box-min-score",
        )
        html = gr.HTML("", elem_id="box-list", js_on_load=LIST_ON_LOAD_JS, apply_default_css=False)
    return BoxListComponents(html=html, min_score=min_score)
