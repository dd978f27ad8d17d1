"""Wiring of the mask-review panel (ui.mask_review_view) to the page's events; ``ui.app.build_app`` calls it."""

from __future__ import annotations

import gradio as gr

from .layout import Components
from .mask_assets import LOAD_MASK_DRAFT_JS, MASK_JS, TAKE_CLICKS_JS
from .mask_review_view import ReviewerCallbacks


def wire_mask(demo: gr.Blocks, c: Components, cb: ReviewerCallbacks) -> None:
    """Connect the mask panel's controls (inside ``demo``'s context; ``ui.app.wire`` calls it)."""
    m, st = c.mask, [c.session]
    outputs = [*m.outputs(), c.draft_out, c.banner_md]
    demo.load(None, js=MASK_JS)
    # trigger_mode="multiple": keys pressed in quick succession each count (A, A, A for three subjects).
    for btn, fn in (
        (m.accept_btn, cb.on_mask_accept),
        (m.refine_btn, cb.on_mask_refine),
        (m.next_btn, cb.on_mask_next),
        (m.prev_btn, cb.on_mask_prev),
        (m.undo_point_btn, cb.on_mask_undo_point),
        (m.clear_points_btn, cb.on_mask_clear_points),
    ):
        btn.click(fn, inputs=st, outputs=outputs, show_progress="hidden", trigger_mode="multiple")
    m.reject_btn.click(cb.on_mask_reject, inputs=[c.session, m.reason], outputs=outputs, trigger_mode="multiple")
    m.reason.submit(cb.on_mask_reason_enter, inputs=[c.session, m.reason], outputs=outputs)
    m.reason.input(
        cb.on_mask_reason,
        inputs=[c.session, m.reason],
        outputs=outputs,
        show_progress="hidden",
        trigger_mode="always_last",
    )
    m.subjects.input(cb.on_mask_pick, inputs=[c.session, m.subjects], outputs=outputs, show_progress="hidden")
    # A click on the picture: the page's script queued it and pressed the hidden button; read the queue, then add.
    m.point_btn.click(None, js=TAKE_CLICKS_JS, outputs=[m.point_in], queue=False, trigger_mode="multiple").then(
        cb.on_mask_points, inputs=[c.session, m.point_in], outputs=outputs, show_progress="hidden"
    )
    m.key.change(None, inputs=[m.key], outputs=[m.draft_in], js=LOAD_MASK_DRAFT_JS, queue=False).then(
        cb.on_mask_restore_draft, inputs=[c.session, m.draft_in], outputs=outputs, show_progress="hidden"
    )
    m.submit_btn.click(cb.on_mask_submit, inputs=st, outputs=c.panel_outputs())
