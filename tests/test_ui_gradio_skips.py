"""``ui.gradio_skips``: an event's outputs left as ``gr.skip()`` are not rebuilt by Gradio, and the
answer the browser gets is the one Gradio's own path gives."""

from __future__ import annotations

import asyncio
from typing import Any

import gradio as gr
from gradio.blocks import Blocks
from gradio.components import base
from gradio.state_holder import SessionState

from hitl_review.ui import gradio_skips


def app() -> tuple[gr.Blocks, list[Any]]:
    with gr.Blocks() as demo:
        md = gr.Markdown("a")
        btn = gr.Button("go")
        gallery = gr.Gallery()
        image = gr.Image()
        state = gr.State(1)
        box = gr.Textbox("t")
        outputs = [md, btn, gallery, image, state, box]
        btn.click(lambda: None, outputs=outputs)
    return demo, outputs


def run(demo: gr.Blocks, predictions: Any, fn: Any) -> list[Any]:
    return asyncio.run(fn(demo, demo.fns[0], predictions, SessionState(demo)))


def test_the_answer_is_gradios_own_and_skipped_outputs_are_not_rebuilt(monkeypatch):
    original = Blocks.postprocess_data
    gradio_skips.install()
    assert gradio_skips.install()  # a second call changes nothing
    patched = Blocks.postprocess_data
    assert patched is not original and getattr(patched, gradio_skips._INSTALLED)
    demo, (md, btn, gallery, image, state, box) = app()
    built: list[str] = []
    init = base.Component.__init__

    def counting_init(self: Any, *a: Any, **k: Any) -> None:
        built.append(type(self).__name__)
        init(self, *a, **k)

    monkeypatch.setattr(base.Component, "__init__", counting_init)
    cases = [  # made afresh for each run: Gradio pops "value" out of an update it processes
        lambda: {md: "b"},
        lambda: {md: "b", btn: gr.update(interactive=False), gallery: gr.skip()},
        lambda: {box: "u", state: 5},
        lambda: {md: gr.skip()},
        lambda: {gallery: [], image: gr.skip(), btn: gr.update(visible=False, value="go")},
    ]
    for case in cases:
        built.clear()
        ours = run(demo, case(), patched)
        ours_built = list(built)
        built.clear()
        theirs = run(demo, case(), original)
        assert ours == theirs, case()
        # Gradio rebuilds every output left out or skipped; ours only the ones given a property update
        assert len(ours_built) == sum(gr_update(v) for v in case().values()), (case(), ours_built)
        assert len(built) >= len(ours_built)
    # a skipped gallery costs Gradio a rebuild; ours none
    built.clear()
    run(demo, {md: "c"}, patched)
    assert built == []
    run(demo, {md: "c"}, original)
    assert "Gallery" in built and "Image" in built


def gr_update(value: Any) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) > 1


def test_what_it_does_not_know_goes_to_gradio_as_it_is():
    demo, (md, btn, *_rest) = app()
    fn = demo.fns[0]
    assert gradio_skips.named_outputs(fn, ["a", None]) is None  # a list
    assert gradio_skips.named_outputs(fn, {}) is None
    assert gradio_skips.named_outputs(fn, {"not a block": 1}) is None
    with gr.Blocks():
        stranger = gr.Markdown()
    assert gradio_skips.named_outputs(fn, {stranger: "x"}) is None  # not an output of this event
    assert gradio_skips.named_outputs(fn, {md: "x", btn: gr.skip()}) == [0]
