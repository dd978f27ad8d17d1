"""The full-size view (``ui.zoom``): the original image at its own pixels with the canvas' boxes drawn where
they are in the original, made once per image and boxes. No server, no browser (the page's part is in
tests/test_box_list_browser.py)."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image

from hitl_review.statecore.models import ImageRef
from hitl_review.ui.panel import MODEL_COLOR, annotator_value, panel_from_snapshot
from hitl_review.ui.session import ReviewerState
from hitl_review.ui.shown import is_shown
from hitl_review.ui.zoom import ZoomView, canvas_boxes, full_size_view, zoom_layout, zoom_note
from tests.ui_fakes import as_raw, model_box, pause, snapshot

W, H = 2400, 1600  # wider than the canvas' 1280 px: the canvas shows it at half size


def panel_and_image(tmp_path: Path) -> tuple[object, Path]:
    original = tmp_path / "original.png"
    Image.new("RGB", (W, H), (250, 250, 250)).save(original)
    image = ImageRef(sha256="ab" * 32, width=W, height=H, url="/api/v1/artifacts/original.png")
    boxes = [model_box(1, (100.0, 200.0, 900.0, 1000.0)), model_box(2, (1500.0, 300.0, 2300.0, 1500.0), "bag")]
    panel = panel_from_snapshot(snapshot(boxes=boxes, active=pause()).model_copy(update={"image": image}))
    assert panel is not None
    return panel, original


def test_the_view_is_the_original_size_with_the_boxes_where_they_are_in_it(tmp_path: Path) -> None:
    panel, original = panel_and_image(tmp_path)
    value = as_raw(annotator_value(panel, "/x/display.jpg"), scale=0.61)  # the canvas' own scale as it drew
    assert [c for c, _, _ in canvas_boxes(panel, value)] == [
        [100.0, 200.0, 900.0, 1000.0],
        [1500.0, 300.0, 2300.0, 1500.0],
    ]
    path, shown = full_size_view(original, panel, value, tmp_path / "zoom")
    assert shown == 2
    with Image.open(path) as img:
        assert img.size == (W, H) and img.format == "JPEG"
        px = np.asarray(img.convert("RGB"), dtype=int)
    # The outline of box 1 in its colour at its original pixels (JPEG: within a few levels), the inside untouched.
    assert np.abs(px[600, 101] - np.array(MODEL_COLOR)).max() < 40, px[600, 101]
    assert np.abs(px[600, 500] - 250).max() < 8, px[600, 500]
    assert np.abs(px[900, 2299] - np.array(MODEL_COLOR)).max() < 40, px[900, 2299]


def test_the_same_boxes_reuse_the_file_and_a_moved_box_makes_another(tmp_path: Path) -> None:
    panel, original = panel_and_image(tmp_path)
    value = as_raw(annotator_value(panel, "/x/display.jpg"))
    first, _ = full_size_view(original, panel, value, tmp_path / "zoom")
    made = first.stat().st_mtime_ns
    again, _ = full_size_view(original, panel, value, tmp_path / "zoom")
    assert again == first and again.stat().st_mtime_ns == made
    moved = as_raw(
        annotator_value(panel, "/x/display.jpg", moved={panel.boxes[0].box_id: (150.0, 200.0, 950.0, 1000.0)})
    )
    other, _ = full_size_view(original, panel, moved, tmp_path / "zoom")
    assert other != first
    assert canvas_boxes(panel, moved)[0][0] == [150.0, 200.0, 950.0, 1000.0]


def test_the_note_says_both_sizes_and_how_many_boxes(tmp_path: Path) -> None:
    panel, _ = panel_and_image(tmp_path)
    assert zoom_note(panel, 2).startswith("**Full size: 2400 × 1600 px** (the canvas shows it at 1280 × 853); 2 boxes")
    assert "1 box as on the canvas" in zoom_note(panel, 1)


def test_without_an_open_panel_the_button_only_hides_the_view(tmp_path: Path) -> None:
    with gr.Blocks():
        z = zoom_layout()
    out = ZoomView(z, tmp_path).on_open(ReviewerState(token="t"), None)
    assert list(out) == [z.panel.style] and not is_shown(out[z.panel.style])
    assert not (tmp_path / "zoom").exists()
