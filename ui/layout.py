"""The reviewer page's components, and the one place that lays them out.

``layout`` must run inside a ``gr.Blocks`` context; it returns every component
the callbacks read or write as one ``Components`` value, so callbacks (and
tests) take them as an argument instead of closing over local names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr
import pandas as pd
from gradio_image_annotation import image_annotator

from .assets import HELP
from .box_list_layout import BoxListComponents, box_list_layout
from .editor import ALL_STAGES, button_text, stage_choices
from .mask_layout import MaskComponents, mask_layout
from .notes_layout import NotesComponents, flagged_filter, notes_head, notes_layout
from .panel import NEW_BOX_COLOR_HEX
from .queue import TABLE_HEADERS
from .session import ReviewerState
from .shown import Shown, shown_style
from .zoom import ZoomComponents, zoom_layout

QUEUE_REFRESH_S = 2.0


@dataclass(frozen=True)
class Components:
    """Every component a callback reads or writes, by the name the callbacks use."""

    session: gr.State
    backend_md: gr.Markdown
    login_col: Shown  # each container is shown or hidden by its style element (ui.shown)
    login_token: gr.Textbox
    login_btn: gr.Button
    login_msg: gr.Markdown
    login_name: gr.Textbox  # optional: checked against the token's owner (ui.signin)
    account_row: Shown  # "Signed in as …" and the sign-out link
    who_md: gr.Markdown
    signout_btn: gr.Button
    main_row: Shown
    queue_table: gr.Dataframe
    queue_note: gr.Markdown
    next_btn: gr.Button
    job_md: gr.Markdown
    status_md: gr.Markdown
    stage_md: gr.Markdown
    banner_md: gr.Markdown
    claim_md: gr.Markdown  # who is reviewing the open job (docs/protocol.md § Claims)
    takeover_btn: gr.Button
    review_col: Shown
    canvas_col: Shown  # the annotator's column: shown with the review panel
    annotator: image_annotator
    label_target: gr.Dropdown
    label_text: gr.Textbox
    label_btn: gr.Button
    review_error: gr.Markdown
    notes_md: gr.Markdown
    submit_btn: gr.Button
    cut_btn: gr.Button
    reapply_btn: gr.Button
    cut_confirm: Shown
    cut_yes: gr.Button
    cut_no: gr.Button
    cancel_btn: gr.Button
    cancel_confirm: Shown
    cancel_yes: gr.Button
    cancel_no: gr.Button
    results_col: Shown
    results_md: gr.Markdown
    results_gallery: gr.Gallery
    mask_gallery: gr.Gallery
    results_files: gr.File
    current_job: gr.Textbox
    shown_pause: gr.Textbox  # the pause whose panel the page's last view showed ("" none): ui.claims.converge
    timer: gr.Timer
    label_btns: tuple[gr.Button, ...]
    undo_btn: gr.Button
    redo_btn: gr.Button
    reset_btn: gr.Button
    pick_in: gr.Textbox  # the selected box and the label chosen for it, from the browser
    draft_out: gr.Textbox  # unsent edits for the browser to keep (or forget)
    pause_key: gr.Textbox  # job and pause of a freshly drawn panel: the browser looks for a draft
    draft_in: gr.Textbox  # the draft the browser kept for that review
    notes_key: gr.Textbox  # the open job's notes' signature: they are drawn again when it changes (ui.notes_wiring)
    redraw_key: gr.Textbox  # a submission's 409 asks for the panel to be drawn again (Callbacks.on_conflict_view)
    stage_filter: gr.Dropdown
    batch_filter: gr.Textbox
    stats_md: gr.Markdown
    stats_btn: gr.Button
    stats_acc: gr.Accordion
    mask: MaskComponents  # the mask-review panel, shown instead of the box editor (ui.mask_layout)
    box_list: BoxListComponents  # the interactive list of the canvas' boxes (ui.box_list_layout)
    notes: NotesComponents  # skip, flag for a lead, comments (ui.notes_layout)
    zoom: ZoomComponents  # the full-size view under the canvas (ui.zoom)

    def panel_outputs(self) -> list[Any]:
        """What a view of the open job may change: the outputs of every event that opens or redraws one."""
        return [
            self.job_md,
            self.status_md,
            self.stage_md,
            self.banner_md,
            self.claim_md,
            self.takeover_btn,
            self.review_col.style,
            self.canvas_col.style,
            self.submit_btn,
            self.cut_btn,
            self.annotator,
            self.notes_md,
            self.label_target,
            self.label_text,
            self.review_error,
            self.reapply_btn,
            self.cut_confirm.style,
            self.cancel_btn,
            self.cancel_confirm.style,
            self.results_col.style,
            self.results_md,
            self.results_gallery,
            self.mask_gallery,
            self.results_files,
            self.current_job,
            self.shown_pause,
            self.undo_btn,
            self.redo_btn,
            self.pause_key,
            self.draft_out,
            self.notes_key,
            self.zoom.panel.style,
            *self.mask.outputs(),
        ]

    def answer_outputs(self) -> list[Any]:
        """What Submit's own event names (``Callbacks.send``): the answer in the banner, a refusal under the
        panel, and the key that sets off a 409's redraw. Gradio's page copies every output an event names
        at each change of its status, so the answer names three and is shown first; the panel's other
        changes come in the event after it (``submit_outputs``)."""
        return [self.banner_md, self.review_error, self.redraw_key]

    def submit_outputs(self) -> list[Any]:
        """What an accepted submission changes after its answer (``Callbacks.after_submit``): the light part
        of ``panel_outputs``. Not the canvas, the galleries or the mask panel's pictures; a 409's redraw
        comes in its own event (``redraw_key``)."""
        return [
            self.job_md,
            self.status_md,
            self.stage_md,
            self.banner_md,
            self.claim_md,
            self.takeover_btn,
            self.review_col.style,
            self.canvas_col.style,
            self.submit_btn,
            self.cut_btn,
            self.review_error,
            self.reapply_btn,
            self.cut_confirm.style,
            self.cancel_btn,
            self.cancel_confirm.style,
            self.results_col.style,
            self.current_job,
            self.shown_pause,
            self.notes_key,
            self.draft_out,
            self.zoom.panel.style,
            self.mask.col.style,
            self.mask.submit_btn,
            self.redraw_key,
        ]


def hidden_box(elem_id: str) -> gr.Textbox:
    """A value the page and the app pass each other (in the DOM, never shown)."""
    return gr.Textbox(value="", visible="hidden", elem_id=elem_id)


def layout(token: str | None, require_login: bool, labels: tuple[str, ...] = ()) -> Components:
    """Lay the page out in the enclosing ``gr.Blocks``; each browser session starts from a copy of
    ``ReviewerState(token)`` (signed in unless ``require_login``). ``labels`` are the configured
    label set, one button each (number keys 1–9 for the first nine)."""
    session = gr.State(ReviewerState(token=token, signed_in=not require_login))

    gr.Markdown("## hitl-review — reviewer")
    backend_md = gr.Markdown("", elem_id="backend-info")
    gr.Markdown(HELP, elem_id="help-line")

    login_col = shown_style("login-panel", require_login)
    with gr.Column(elem_id="login-panel"):
        login_name = gr.Textbox(
            label="Your name", elem_id="login-name", max_lines=1, placeholder="as your admin added you (optional)"
        )
        login_token = gr.Textbox(
            label="API token", type="password", elem_id="login-token", placeholder="the reviewer token you were given"
        )
        login_btn = gr.Button("Sign in", variant="primary", elem_id="login-btn")
        login_msg = gr.Markdown("", elem_id="login-message")
    account_row = shown_style("account-bar", False)
    with gr.Row(elem_id="account-bar"):
        who_md = gr.Markdown("", elem_id="signed-in-as")
        signout_btn = gr.Button("Sign out", size="sm", elem_id="signout-btn", scale=0, min_width=100)

    # Hidden by its style element until sign-in (ui.shown), never made invisible: an invisible row is
    # unmounted, and the canvas mounted with it by the sign-in's update sometimes stayed empty (``?job=``).
    main_row = shown_style("main-panel", not require_login)
    with gr.Row(elem_id="main-panel"):
        with gr.Column(scale=2, min_width=460):
            gr.Markdown("### Waiting for review")
            stage_filter = gr.Dropdown(
                choices=stage_choices(),
                value=ALL_STAGES,
                label="Stage",
                elem_id="stage-filter",
                interactive=True,
            )
            batch_filter = gr.Textbox(
                label="Batch",
                placeholder="every batch — or a name from hitl submit --batch, then Enter",
                elem_id="batch-filter",
                max_lines=1,
            )
            flagged_only = flagged_filter()
            queue_table = gr.Dataframe(
                value=pd.DataFrame(columns=TABLE_HEADERS),
                headers=TABLE_HEADERS,
                datatype=["markdown", "str", "str", "str", "number", "str"],
                interactive=False,
                wrap=True,
                elem_id="queue-table",
                column_widths=["14%", "26%", "20%", "14%", "8%", "18%"],
                label="Oldest first — click a row to open it",
            )
            queue_note = gr.Markdown("", elem_id="queue-note")
            next_btn = gr.Button("Open next job (N)", elem_id="next-job-btn")
            with gr.Accordion("Review stats", open=False, elem_id="stats-panel") as stats_acc:
                stats_md = gr.Markdown("", elem_id="stats")
                stats_btn = gr.Button("Refresh stats", size="sm", elem_id="stats-btn")
        with gr.Column(scale=3):
            job_md = gr.Markdown("No job open — pick one in the queue.", elem_id="job-id")
            status_md = gr.Markdown("", elem_id="job-status")
            stage_md = gr.Markdown("", elem_id="stage-text")
            banner_md = gr.Markdown("", elem_id="banner")
            claim_md = gr.Markdown("", elem_id="claim-note")
            takeover_btn = gr.Button("Take over", visible=False, elem_id="takeover-btn", size="sm")
            head = notes_head()  # the open job's flag and comments, above its panel
            # The canvas and the review panel are never made invisible, only hidden by their style element
            # (ui.shown): Gradio 6 unmounts the children of an invisible column, and the annotator mounted a
            # second time stayed empty, so no panel after a submission ever drew; mounting the panel's twenty
            # components again on every N (and unmounting them on every submission) was most of the
            # browser's work on the way to an interactive panel.
            canvas_col = shown_style("canvas-panel", False)
            with gr.Column(elem_id="canvas-panel"):
                annotator = image_annotator(
                    value=None,
                    label="Boxes",
                    show_label=False,
                    elem_id="annotator",
                    image_type="filepath",
                    sources=None,
                    disable_edit_boxes=True,
                    show_remove_button=True,
                    show_clear_button=False,
                    show_download_button=False,
                    show_share_button=False,
                    label_list=["new"],
                    label_colors=[NEW_BOX_COLOR_HEX],
                    box_min_size=8,
                    enable_keyboard_shortcuts=True,
                )
                zoom = zoom_layout()
            review_col = shown_style("review-panel", False)
            with gr.Column(elem_id="review-panel"):
                with gr.Row(elem_id="edit-toolbar"):
                    undo_btn = gr.Button("↶ Undo (Ctrl+Z)", elem_id="undo-btn", size="sm", interactive=False)
                    redo_btn = gr.Button("↷ Redo (Ctrl+Shift+Z)", elem_id="redo-btn", size="sm", interactive=False)
                    reset_btn = gr.Button("Reset to model boxes", elem_id="reset-btn", size="sm")
                label_btns: list[gr.Button] = []
                if labels:
                    with gr.Row(elem_id="label-set"):
                        for i in range(len(labels)):
                            label_btns.append(
                                gr.Button(
                                    button_text(labels, i),
                                    elem_id=f"label-btn-{i + 1}",
                                    elem_classes=["label-btn"],
                                    size="sm",
                                )
                            )
                with gr.Row(equal_height=True):
                    label_target = gr.Dropdown(
                        choices=[], value=None, label="Box to label", elem_id="label-target", scale=2
                    )
                    label_text = gr.Textbox(
                        label="Label", placeholder="e.g. sneaker — press Enter", elem_id="new-box-label", scale=3
                    )
                    label_btn = gr.Button("Set label", elem_id="apply-label-btn", scale=1)
                box_list = box_list_layout()
                review_error = gr.Markdown("", elem_id="review-error")
                notes_md = gr.Markdown("", elem_id="box-notes")
                with gr.Row():
                    submit_btn = gr.Button("Submit (Enter)", variant="primary", elem_id="submit-btn")
                    cut_btn = gr.Button("Cut nothing", elem_id="cut-nothing-btn")
                reapply_btn = gr.Button("Re-apply my edits", visible=False, elem_id="reapply-btn")
                cut_confirm = shown_style("confirm-cut-nothing", False)
                with gr.Row(elem_id="confirm-cut-nothing"):
                    gr.Markdown("**Cut nothing?** The job ends as EMPTY_SELECTION and no subject is cut out.")
                    cut_yes = gr.Button("Yes, cut nothing", variant="stop", elem_id="confirm-cut-nothing-btn")
                    cut_no = gr.Button("Back", elem_id="cut-nothing-back-btn")
            mask = mask_layout()
            notes = notes_layout(flagged_only, head)
            cancel_btn = gr.Button("Cancel job", variant="stop", visible=False, elem_id="cancel-job-btn")
            cancel_confirm = shown_style("confirm-cancel", False)
            with gr.Row(elem_id="confirm-cancel"):
                gr.Markdown("**Cancel this job?** It stops for good; nothing more is cut out.")
                cancel_yes = gr.Button("Yes, cancel the job", variant="stop", elem_id="confirm-cancel-btn")
                cancel_no = gr.Button("Back", elem_id="cancel-back-btn")
            results_col = shown_style("results-panel", False)
            with gr.Column(elem_id="results-panel"):
                gr.Markdown("### Results")
                results_md = gr.Markdown("", elem_id="results-summary")
                results_gallery = gr.Gallery(
                    label="Cut-outs (on a checkerboard)",
                    elem_id="results-gallery",
                    columns=4,
                    object_fit="contain",
                    format="png",
                    height="auto",
                )
                mask_gallery = gr.Gallery(
                    label="Masks over the image",
                    elem_id="mask-gallery",
                    columns=4,
                    object_fit="contain",
                    format="png",
                    height="auto",
                )
                results_files = gr.File(
                    label="Downloads (cut-outs and masks, PNG)",
                    file_count="multiple",
                    interactive=False,
                    elem_id="results-files",
                )
    current_job, shown_pause = hidden_box("current-job"), hidden_box("shown-pause")
    pick_in, draft_out = hidden_box("pick-in"), hidden_box("draft-out")
    pause_key, draft_in = hidden_box("pause-key"), hidden_box("draft-in")
    notes_key, redraw_key = hidden_box("notes-key"), hidden_box("redraw-key")
    timer = gr.Timer(QUEUE_REFRESH_S)
    return Components(
        session=session,
        backend_md=backend_md,
        login_col=login_col,
        login_token=login_token,
        login_btn=login_btn,
        login_msg=login_msg,
        login_name=login_name,
        account_row=account_row,
        who_md=who_md,
        signout_btn=signout_btn,
        main_row=main_row,
        queue_table=queue_table,
        queue_note=queue_note,
        next_btn=next_btn,
        job_md=job_md,
        status_md=status_md,
        stage_md=stage_md,
        banner_md=banner_md,
        claim_md=claim_md,
        takeover_btn=takeover_btn,
        review_col=review_col,
        canvas_col=canvas_col,
        annotator=annotator,
        label_target=label_target,
        label_text=label_text,
        label_btn=label_btn,
        review_error=review_error,
        notes_md=notes_md,
        submit_btn=submit_btn,
        cut_btn=cut_btn,
        reapply_btn=reapply_btn,
        cut_confirm=cut_confirm,
        cut_yes=cut_yes,
        cut_no=cut_no,
        cancel_btn=cancel_btn,
        cancel_confirm=cancel_confirm,
        cancel_yes=cancel_yes,
        cancel_no=cancel_no,
        results_col=results_col,
        results_md=results_md,
        results_gallery=results_gallery,
        mask_gallery=mask_gallery,
        results_files=results_files,
        current_job=current_job,
        shown_pause=shown_pause,
        timer=timer,
        label_btns=tuple(label_btns),
        undo_btn=undo_btn,
        redo_btn=redo_btn,
        reset_btn=reset_btn,
        pick_in=pick_in,
        draft_out=draft_out,
        pause_key=pause_key,
        draft_in=draft_in,
        notes_key=notes_key,
        redraw_key=redraw_key,
        stage_filter=stage_filter,
        batch_filter=batch_filter,
        stats_md=stats_md,
        stats_btn=stats_btn,
        stats_acc=stats_acc,
        mask=mask,
        box_list=box_list,
        notes=notes,
        zoom=zoom,
    )
