"""Every event of the reviewer page keeps its loading status on the banner only (``ui.progress_on``): the
config the browser reads names the banner as each backend event's progress target, so Gradio's page never
tracks (and copies, at every status change) the review panel's components."""

from __future__ import annotations

import gradio as gr

from hitl_review.ui import progress_on
from hitl_review.ui.app import build_app


def test_the_page_tracks_every_events_progress_on_the_banner_alone() -> None:
    demo = build_app("http://127.0.0.1:9", "tok")
    banner = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "banner")
    deps = demo.get_config_file()["dependencies"]
    backend = [d for d in deps if d["backend_fn"]]
    assert len(backend) > 50  # the page's handlers, not a handful
    assert all(d["show_progress_on"] == [banner._id] for d in backend), [
        d["id"] for d in backend if d["show_progress_on"] != [banner._id]
    ]
    # Outputs are unchanged: the panel's events still update the panel.
    assert max(len(d["outputs"]) for d in backend) > 40


def test_narrow_leaves_browser_only_steps_and_chosen_targets_alone() -> None:
    with gr.Blocks() as demo:
        a, b, c = gr.Markdown(), gr.Markdown(), gr.Markdown()
        btn = gr.Button()
        btn.click(lambda: ("x", "y"), outputs=[a, b])  # tracked on the banner after narrow
        btn.click(None, js="() => 'z'", outputs=[b])  # the browser's own: Gradio keeps no status for it
        btn.click(lambda: "w", outputs=[b], show_progress_on=[b])  # chosen: kept
    assert progress_on.narrow(demo, c) == 1
    first, js_only, chosen = demo.fns.values()
    assert first.show_progress_on == [c]
    assert js_only.show_progress_on is None
    assert chosen.show_progress_on == [b]


def test_the_events_a_reviewer_waits_on_answer_over_plain_http() -> None:
    """Submit, "Cut nothing", N and Skip are answered on their HTTP request (``queue=False``): no queue
    join and no event stream to open again before the answer (docs/benchmarks.md, stops 31 and 36);
    the follower after N and Skip stays on the queue (it streams)."""
    demo = build_app("http://127.0.0.1:9", "tok")
    ids = {getattr(b, "elem_id", None): b._id for b in demo.blocks.values()}
    deps = demo.get_config_file()["dependencies"]

    def first_backend_event(elem_id: str) -> dict:
        return next(d for d in deps if d["backend_fn"] and (ids[elem_id], "click") in d["targets"])

    for elem_id in ("submit-btn", "next-job-btn", "skip-btn"):
        assert first_backend_event(elem_id)["queue"] is False, elem_id
    assert any(d["backend_fn"] and d["queue"] is not False and d["types"]["generator"] for d in deps)


def test_an_idle_page_server_polls_its_queue_every_20_ms_not_every_millisecond() -> None:
    """Gradio's queue looks for work every 1 ms when free (10 ms for progress): ~80 ms/s of the UI
    process's CPU with no page open. The app's queue sleeps ``FREE_POLL_S`` between looks (ui.queue_polling)."""
    from gradio.queueing import Queue

    from hitl_review.ui.queue_polling import FREE_POLL_S, calm

    demo = build_app("http://127.0.0.1:9", "tok")
    assert isinstance(demo._queue, Queue)
    assert demo._queue.sleep_when_free == FREE_POLL_S == 0.02
    assert demo._queue.progress_update_sleep_when_free == FREE_POLL_S
    # A Gradio whose queue has no such attributes is left as it is, with a warning, not broken.
    bare = type("NoQueue", (), {})()
    assert calm(bare) is False  # type: ignore[arg-type]  # deliberately not a Blocks
