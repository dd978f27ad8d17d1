"""The Gradio reviewer app: a live queue of waiting jobs and the review panel.

``build_app`` lays the page out (``ui.layout``), makes the handlers
(``ui.callbacks``) and wires them to the components' events here. What each
panel shows is decided by plain functions (``ui.panel``, ``ui.annotator``,
``ui.session``, ``ui.queue``, ``ui.results``). Per-reviewer data lives in one
``gr.State`` (``ReviewerState``), never in module globals. ``launch`` is
left to ``ui.server`` and ``python -m hitl_review.ui``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import gradio as gr

from hitl_review.statecore.trusted_proxy import TrustedProxies

from . import gradio_skips, progress_on, queue_polling
from .assets import KEYS_JS, LOAD_DRAFT_JS, SAVE_DRAFT_JS, URL_JS, pick_js
from .box_list_view import BoxListView, wire_box_list
from .callbacks import Callbacks, show
from .cookie_signin import SIGN_IN_JS, SIGN_OUT_JS
from .editor import labels_from_env
from .images import ImageStore
from .layout import Components, layout
from .mask_review_view import ReviewerCallbacks
from .mask_wiring import wire_mask
from .notes_wiring import wire_notes
from .zoom import wire_zoom


def default_store_root() -> Path:
    """Where the app keeps the images, thumbnails and results it shows (``ui.images.ImageStore``)."""
    return Path(tempfile.gettempdir()) / "hitl-ui"


def build_app(
    api_url: str,
    token: str | None = None,
    *,
    require_login: bool = False,
    labels: tuple[str, ...] | None = None,
    store_root: Path | None = None,
    trusted_proxies: tuple[str, ...] = (),
) -> gr.Blocks:
    """The reviewer app for the control plane at ``api_url``.

    Without ``require_login`` every browser acts with ``token`` (the local
    token of ``hitl up``); with it, each reviewer signs in with their own API token.
    ``labels`` is the configured label set (default: ``HITL_LABELS``, comma-separated).
    ``trusted_proxies``: the addresses of an authenticating proxy whose user is signed in (ui.signin).
    """
    labels = labels_from_env() if labels is None else labels
    gradio_skips.install()  # the outputs an event leaves alone cost nothing (ui.gradio_skips)
    # Gradio copies every image it serves into its cache; drop copies older than a day, hourly.
    demo = gr.Blocks(title="hitl-review · reviewer", analytics_enabled=False, delete_cache=(3600, 86400))
    with demo:
        comps = layout(token, require_login, labels)
        root = store_root or default_store_root()
        cb = ReviewerCallbacks(comps, api_url, ImageStore(root), labels)  # box stages and mask review
        cb.proxies = TrustedProxies(trusted_proxies)
        boxes = BoxListView(comps)  # the interactive box list
        wire(demo, comps, cb, boxes)
        wire_mask(demo, comps, cb)
        wire_box_list(demo, comps, boxes)
        wire_notes(demo, comps, cb)  # skip, flag for a lead, comments
        wire_zoom(comps.zoom, comps.session, comps.annotator, root / "zoom")  # the full-size view
        progress_on.narrow(demo, comps.banner_md)  # the page tracks loading statuses on the banner only
    demo.queue(default_concurrency_limit=None)
    queue_polling.calm(demo)  # an idle page server sleeps (ui.queue_polling)
    return demo


def wire(demo: gr.Blocks, c: Components, cb: Callbacks, boxes: BoxListView) -> None:
    """Connect the handlers to the components' events (inside ``demo``'s context); ``boxes`` is the box
    list, which follows the canvas."""
    panel_outputs = c.panel_outputs()
    st = [c.session]

    def then_follow(event: Any) -> None:
        """Follow the job that ``event`` may have opened, once it has answered."""
        event.then(cb.follow_on_page, inputs=st, outputs=panel_outputs, show_progress="hidden")

    def then_draw(event: Any) -> None:
        """Taking a job over is two steps: ``event`` lays the panel out with an empty canvas, ``after_open``
        draws it (drawn in the update that also showed another job's panel, the annotator kept an image
        without size while its column was unmounted). N, S, a queue click, a sign-in and a page load at
        ``?job=`` draw in their one step (``after_open`` then has nothing to do): the main
        row and the canvas' column are never unmounted any more, only hidden by their style element (ui.shown), and
        N came out drawn in every run of the reviewer benchmark (docs/benchmarks.md)."""
        then_follow(event.then(cb.after_open, inputs=st, outputs=panel_outputs, show_progress="hidden"))

    demo.load(None, js=KEYS_JS)
    # The proxy's user or the session this browser's cookie names (ui.signin) first, then the page as usual.
    restored = demo.load(cb.on_restore, inputs=[c.session], outputs=cb.restore_outputs(), show_progress="hidden")
    then_draw(
        restored.then(
            cb.on_load,
            inputs=st,
            outputs=[*panel_outputs, c.queue_table, c.queue_note, c.backend_md],
            show_progress="hidden",
        )
    )
    demo.unload(cb.on_unload)
    for listen in (c.stage_filter.change, c.batch_filter.submit, c.batch_filter.blur):  # the queue's filters
        listen(cb.on_filters, inputs=[c.session, c.stage_filter, c.batch_filter], outputs=[c.queue_table, c.queue_note])
    c.stats_btn.click(cb.on_stats, inputs=st, outputs=[c.stats_md])
    c.stats_acc.expand(cb.on_stats, inputs=st, outputs=[c.stats_md])
    # The tick also renews the open job's claim and notices a takeover (ui.claims).
    tick_outputs = [
        c.queue_table,
        c.queue_note,
        c.claim_md,
        c.takeover_btn,
        c.review_col.style,
        c.canvas_col.style,
        c.banner_md,
    ]
    tick_outputs += [c.submit_btn, c.cut_btn, c.mask.submit_btn, c.redraw_key]
    # With the job and pause the page shows (its last view's ``current_job``, ``shown_pause``): a page left on
    # another job, or on a closed round while the session has the next one open, is drawn again.
    c.timer.tick(
        cb.on_tick, inputs=[c.session, c.current_job, c.shown_pause], outputs=tick_outputs, show_progress="hidden"
    )
    c.current_job.change(None, inputs=[c.current_job], js=URL_JS)

    then_draw(c.queue_table.select(cb.on_queue_select, inputs=st, outputs=panel_outputs))
    # N draws the panel in its own step (``Callbacks.on_next``); its follower comes next. Over plain HTTP
    # as Submit: no queue join, no event stream to open again before the answer can come.
    then_follow(c.next_btn.click(cb.on_next, inputs=st, outputs=panel_outputs, show_progress="hidden", queue=False))
    then_draw(c.takeover_btn.click(cb.on_take_over, inputs=st, outputs=panel_outputs))
    login_outputs = [*panel_outputs, *cb.restore_outputs(), c.queue_table, c.queue_note]
    # The token goes to the sign-in route by fetch (ui.cookie_signin), which sets the session cookie; then
    # the app signs in from that cookie. The token is never an input of a Gradio event.
    for trigger in (c.login_btn.click, c.login_token.submit):
        sent = trigger(None, js=SIGN_IN_JS, inputs=[c.login_name, c.login_token], outputs=[c.login_msg, c.login_token])
        then_draw(sent.then(cb.on_login, inputs=[c.session, c.login_msg], outputs=login_outputs))
    c.signout_btn.click(cb.on_sign_out, inputs=st, queue=False).then(None, js=SIGN_OUT_JS)

    # preprocess=False: the annotator's raw value (boxes in canvas units with their scale) is read by
    # ui.annotator without decoding the image on every click.
    edit_outputs = [c.notes_md, c.label_target, c.undo_btn, c.redo_btn, c.draft_out]

    def on_canvas(st: Any, value: Any, target: str | None, min_score: float | None) -> dict[Any, Any]:
        """The canvas reported a value: the edit recorded and the box list drawn again, in one event (two
        listeners were two round trips per value, each opening of a job included)."""
        out = cb.on_annotator_change(st, value, target)
        out.update(boxes.on_canvas(st, value, min_score))
        return out

    c.annotator.change(
        on_canvas,
        inputs=[c.session, c.annotator, c.label_target, c.box_list.min_score],
        outputs=[*edit_outputs, *c.box_list.outputs()],
        preprocess=False,
        show_progress="hidden",
    )
    label_inputs = [c.session, c.annotator, c.label_target, c.label_text]
    label_outputs = [c.annotator, c.label_text, c.review_error, *edit_outputs]
    wire_editor(c, cb, label_outputs)
    c.label_btn.click(cb.on_apply_label, inputs=label_inputs, outputs=label_outputs, preprocess=False)
    c.label_text.submit(cb.on_apply_label, inputs=label_inputs, outputs=label_outputs, preprocess=False)
    c.reapply_btn.click(cb.on_reapply, inputs=st, outputs=[c.annotator, c.reapply_btn, c.review_error, c.banner_md])

    # Submit's answer names three outputs (the banner first, over plain HTTP: no queue join, no stream to
    # open); the panel's light outputs follow in the next event, and a 409's redraw is its own event.
    answer_outputs, submit_outputs = c.answer_outputs(), c.submit_outputs()
    for send, trigger in ((cb.on_submit, c.submit_btn.click), (cb.on_cut_nothing, c.cut_yes.click)):
        trigger(
            send,
            inputs=[c.session, c.annotator],
            outputs=answer_outputs,
            preprocess=False,
            show_progress="hidden",  # no progress spinner laid over the outputs
            queue=False,
        ).then(cb.after_submit, inputs=st, outputs=submit_outputs, show_progress="hidden")
    c.redraw_key.change(cb.on_conflict_view, inputs=st, outputs=panel_outputs, show_progress="hidden")
    c.cut_btn.click(show((c.cut_confirm, True)), outputs=[c.cut_confirm.style], queue=False)
    c.cut_no.click(show((c.cut_confirm, False)), outputs=[c.cut_confirm.style], queue=False)
    c.cancel_btn.click(show((c.cancel_confirm, True)), outputs=[c.cancel_confirm.style], queue=False)
    c.cancel_no.click(show((c.cancel_confirm, False)), outputs=[c.cancel_confirm.style], queue=False)
    c.cancel_yes.click(cb.on_cancel, inputs=st, outputs=panel_outputs)


def wire_editor(c: Components, cb: Callbacks, outputs: list[Any]) -> None:
    """Label buttons (and their number keys), undo/redo/reset, and the browser-kept drafts."""
    for n, btn in enumerate(c.label_btns, start=1):
        # The browser first says which box is selected (pick_in), then the app labels it.
        # trigger_mode="multiple": keys pressed in quick succession each count (Gradio's default
        # drops a click while the previous one of the same button is still running).
        btn.click(None, js=pick_js(n), outputs=[c.pick_in], queue=False, trigger_mode="multiple").then(
            cb.on_pick_label, inputs=[c.session, c.annotator, c.pick_in], outputs=outputs, preprocess=False
        )
    # With the canvas' value: the state each acts on is the one on screen (``EditorHandlers.seen``).
    for btn, fn in ((c.undo_btn, cb.on_undo), (c.redo_btn, cb.on_redo), (c.reset_btn, cb.on_reset)):
        btn.click(
            fn,
            inputs=[c.session, c.annotator],
            outputs=outputs,
            show_progress="hidden",
            trigger_mode="multiple",
            preprocess=False,
        )
    c.draft_out.change(None, inputs=[c.draft_out], js=SAVE_DRAFT_JS, queue=False)
    # A drawn review's kept draft: the app hears of it only when there is one (``draft_in`` changes; the
    # page's answer names the drawing, so a draft found again is a change too), not on every drawing.
    c.pause_key.change(None, inputs=[c.pause_key], outputs=[c.draft_in], js=LOAD_DRAFT_JS, queue=False)
    c.draft_in.change(
        cb.on_restore_draft, inputs=[c.session, c.draft_in], outputs=[*outputs, c.banner_md], show_progress="hidden"
    )
