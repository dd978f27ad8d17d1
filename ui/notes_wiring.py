"""Wiring of the skip, flag and comment controls (ui.notes_view) to the page's events; ``ui.app.build_app``
calls it."""

from __future__ import annotations

import gradio as gr

from .callbacks import Callbacks
from .layout import Components
from .notes_view import NotesView


def wire_notes(demo: gr.Blocks, c: Components, cb: Callbacks) -> NotesView:
    """Connect the notes' controls (inside ``demo``'s context, after ``ui.app.wire``)."""
    ns, n, st = NotesView(cb), c.notes, [c.session]
    shown = n.outputs()
    # The open job's notes are drawn again when what they show changes: every view of the job names
    # ``notes_key``, its notes' signature (``ReviewerState.notes_signature``: a job opened or closed, a pause
    # opened or answered, the job's end, a flag or comment, a colleague's too through the follower), so a
    # status line moving on sets off no event. Runs that would overlap collapse into the last one.
    c.notes_key.change(ns.on_show, inputs=st, outputs=shown, show_progress="hidden", trigger_mode="always_last")
    n.flagged_only.change(ns.on_flagged_only, inputs=[c.session, n.flagged_only], outputs=[c.queue_table, c.queue_note])

    # Skip, then the next job as "Open next job (N)" opens it: laid out, drawn, followed (ui.app.wire's then_draw);
    # over plain HTTP as N.
    panel = c.panel_outputs()
    skipped = n.skip_btn.click(ns.on_skip, inputs=st, outputs=[*panel, n.error_md], queue=False)
    drawn = skipped.then(cb.after_open, inputs=st, outputs=panel, show_progress="hidden")
    drawn.then(cb.follow_on_page, inputs=st, outputs=panel, show_progress="hidden")

    noted = [*shown, c.banner_md]
    n.flag_btn.click(ns.on_flag, inputs=[c.session, n.flag_reason], outputs=[*noted, n.flag_reason])
    n.flag_reason.submit(ns.on_flag, inputs=[c.session, n.flag_reason], outputs=[*noted, n.flag_reason])
    n.unflag_btn.click(ns.on_unflag, inputs=st, outputs=noted)
    n.comment_btn.click(ns.on_comment, inputs=[c.session, n.comment_text], outputs=[*shown, n.comment_text])
    n.comment_text.submit(ns.on_comment, inputs=[c.session, n.comment_text], outputs=[*shown, n.comment_text])
    return ns
