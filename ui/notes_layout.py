"""The reviewer page's skip, flag and comment controls (ui.notes_view; docs/protocol.md § Flags, skips
and comments), laid out by ``ui.layout`` in three places: the "Flagged only" filter beside the queue's
filters, the open job's flag and comments above its review panel (``notes_head``: the next reviewer
reads them first), and the controls under the panel, beside "Cancel job" (``notes_layout``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from .shown import Shown, shown_style


@dataclass(frozen=True)
class NotesHead:
    """What the open job's notes say, above its review panel."""

    flag_md: gr.Markdown
    comments_md: gr.Markdown


@dataclass(frozen=True)
class NotesComponents:
    flagged_only: gr.Checkbox  # the queue lists only the jobs flagged for a lead
    flag_md: gr.Markdown  # who flagged the open job, and why
    comments_md: gr.Markdown  # the open job's comments, oldest first
    col: Shown  # the controls, shown while a live job is open (by a style element: ui.shown)
    skip_btn: gr.Button
    flag_reason: gr.Textbox
    flag_btn: gr.Button
    unflag_btn: gr.Button
    comment_text: gr.Textbox
    comment_btn: gr.Button
    error_md: gr.Markdown  # a refused note, in words

    def outputs(self) -> list[Any]:
        """What showing the open job's notes may change."""
        return [
            self.flag_md,
            self.comments_md,
            self.col.style,
            self.skip_btn,
            self.flag_btn,
            self.unflag_btn,
            self.comment_btn,
            self.error_md,
        ]


def flagged_filter() -> gr.Checkbox:
    """The queue's "Flagged only" filter (laid out beside the stage and batch filters)."""
    return gr.Checkbox(
        value=False,
        label="Flagged only (⚑ for a lead)",
        elem_id="flagged-only",
        interactive=True,
    )


def notes_head() -> NotesHead:
    """The open job's flag and comments (laid out above the review panel)."""
    return NotesHead(flag_md=gr.Markdown("", elem_id="flag-note"), comments_md=gr.Markdown("", elem_id="job-comments"))


def notes_layout(flagged_only: gr.Checkbox, head: NotesHead) -> NotesComponents:
    """Lay the controls out where it is called (under the review panel, inside ``ui.layout.layout``)."""
    col = shown_style("notes-panel", False)
    with gr.Column(elem_id="notes-panel"):
        with gr.Row(equal_height=True, elem_id="flag-row"):
            skip_btn = gr.Button("Skip (S)", elem_id="skip-btn", scale=1, min_width=110)
            flag_reason = gr.Textbox(
                label="Flag for a lead — why",
                placeholder="e.g. the boxes are unclear, a lead should decide — press Enter",
                elem_id="flag-reason",
                max_lines=1,
                scale=4,
            )
            flag_btn = gr.Button("⚑ Flag", elem_id="flag-btn", scale=1, min_width=90)
            unflag_btn = gr.Button("Unflag", visible=False, elem_id="unflag-btn", scale=1, min_width=90)
        with gr.Row(equal_height=True, elem_id="comment-row"):
            comment_text = gr.Textbox(
                label="Comment for the next reviewer",
                placeholder="e.g. box 2 is a reflection, not a shoe — press Enter",
                elem_id="comment-text",
                max_lines=1,
                scale=5,
            )
            comment_btn = gr.Button("Add comment", elem_id="comment-btn", scale=1, min_width=110)
        error_md = gr.Markdown("", elem_id="notes-error")
    return NotesComponents(
        flagged_only=flagged_only,
        flag_md=head.flag_md,
        comments_md=head.comments_md,
        col=col,
        skip_btn=skip_btn,
        flag_reason=flag_reason,
        flag_btn=flag_btn,
        unflag_btn=unflag_btn,
        comment_text=comment_text,
        comment_btn=comment_btn,
        error_md=error_md,
    )
