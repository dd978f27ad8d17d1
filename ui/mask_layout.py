"""The mask-review panel's components (ui.mask_review_view): laid out by ``ui.layout`` in place of the
box editor, shown while the open job waits in ``WAITING_MASK_REVIEW``.

The picture is a plain ``gr.Image`` rather than the box editor's ``gradio_image_annotation``: the
annotator draws and moves boxes but takes no point clicks, and neither it nor ``gr.Image.select``
(which gives the clicked pixel) says whether Shift was held or the right button used. A small script
(``ui.mask_assets.MASK_JS``) listens for clicks on this picture instead: it computes the pixel the
way Gradio's own select does, notes the button and Shift, names the picture clicked (its file name
says which pause and subject it shows) and presses a hidden button whose handler reads the clicks.
One path for a left, a Shift- and a right click, and a click on a picture of another subject (the
reviewer moved on meanwhile) is recognised and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from .mask_assets import MASK_HELP
from .shown import Shown, shown_style


@dataclass(frozen=True)
class MaskComponents:
    col: Shown  # the panel, shown by its style element (ui.shown)
    subjects: gr.Radio
    image: gr.Image
    cutout: gr.Image
    subject_md: gr.Markdown
    accept_btn: gr.Button
    reject_btn: gr.Button
    refine_btn: gr.Button
    prev_btn: gr.Button
    next_btn: gr.Button
    reason: gr.Textbox
    undo_point_btn: gr.Button
    clear_points_btn: gr.Button
    summary_md: gr.Markdown
    error_md: gr.Markdown
    submit_btn: gr.Button
    point_btn: gr.Button  # pressed by the page's script after a click on the picture
    point_in: gr.Textbox  # the clicks, from the browser
    key: gr.Textbox  # job and pause of a freshly drawn review: the browser looks for a kept draft
    draft_in: gr.Textbox  # the draft the browser kept for that review

    def outputs(self) -> list[Any]:
        """What drawing the review (or closing it) may change."""
        return [
            self.col.style,
            self.subjects,
            self.image,
            self.cutout,
            self.subject_md,
            self.accept_btn,
            self.reject_btn,
            self.refine_btn,
            self.reason,
            self.summary_md,
            self.error_md,
            self.submit_btn,
            self.key,
        ]


def mask_layout() -> MaskComponents:
    """Lay the panel out where it is called (inside ``ui.layout.layout``'s review column)."""
    col = shown_style("mask-review-panel", False)
    with gr.Column(elem_id="mask-review-panel"):
        gr.Markdown(MASK_HELP, elem_id="mask-help")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=360):
                image = gr.Image(
                    value=None,
                    type="filepath",
                    interactive=False,
                    label="The mask over the image — in Refine, click to add points",
                    elem_id="mask-image",
                    buttons=[],
                    height=480,
                )
            with gr.Column(scale=2, min_width=220):
                cutout = gr.Image(
                    value=None,
                    type="filepath",
                    interactive=False,
                    label="The cut-out (on a checkerboard)",
                    elem_id="mask-cutout",
                    buttons=[],
                    height=300,
                )
                subject_md = gr.Markdown("", elem_id="mask-subject")
        with gr.Row(elem_id="mask-decide"):
            accept_btn = gr.Button("✓ Accept (A)", elem_id="mask-accept-btn")
            reject_btn = gr.Button("✗ Reject (R)", elem_id="mask-reject-btn")
            refine_btn = gr.Button("✎ Refine (F)", elem_id="mask-refine-btn")
        reason = gr.Textbox(
            label="Reason (needed to reject)",
            placeholder="e.g. the product is cut in half — press Enter",
            elem_id="mask-reason",
            max_lines=1,
        )
        with gr.Row(elem_id="mask-points"):
            undo_point_btn = gr.Button("Remove last point (Ctrl+Z)", size="sm", elem_id="mask-undo-point-btn")
            clear_points_btn = gr.Button("Clear points", size="sm", elem_id="mask-clear-points-btn")
            prev_btn = gr.Button("◀ Previous subject (Shift+N)", size="sm", elem_id="mask-prev-btn")
            next_btn = gr.Button("Next subject (N) ▶", size="sm", elem_id="mask-next-btn")
        subjects = gr.Radio(choices=[], value=None, label="Subjects and your decisions", elem_id="mask-subjects")
        summary_md = gr.Markdown("", elem_id="mask-summary")
        error_md = gr.Markdown("", elem_id="mask-error")
        submit_btn = gr.Button(
            "Submit decisions (Enter)", variant="primary", interactive=False, elem_id="mask-submit-btn"
        )
        point_btn = gr.Button("point", visible="hidden", elem_id="mask-point-btn")
    point_in = gr.Textbox(value="", visible="hidden", elem_id="mask-point-in")
    key = gr.Textbox(value="", visible="hidden", elem_id="mask-pause-key")
    draft_in = gr.Textbox(value="", visible="hidden", elem_id="mask-draft-in")
    return MaskComponents(
        col=col,
        subjects=subjects,
        image=image,
        cutout=cutout,
        subject_md=subject_md,
        accept_btn=accept_btn,
        reject_btn=reject_btn,
        refine_btn=refine_btn,
        prev_btn=prev_btn,
        next_btn=next_btn,
        reason=reason,
        undo_point_btn=undo_point_btn,
        clear_points_btn=clear_points_btn,
        summary_md=summary_md,
        error_md=error_md,
        submit_btn=submit_btn,
        point_btn=point_btn,
        point_in=point_in,
        key=key,
        draft_in=draft_in,
    )
