"""The canvas' display image (``ui.images.ImageStore.display``): at most ``DISPLAY_MAX_W`` pixels wide, a
JPEG, with the boxes sent in its pixels and read back in the original's, exactly (``ui.panel.to_display``,
``from_display``). No server, no browser."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from hitl_review.statecore.models import ImageRef
from hitl_review.ui.annotator import apply_label, edits_between, read_annotator, subjects_from_annotator
from hitl_review.ui.images import ImageStore
from hitl_review.ui.panel import (
    DISPLAY_MAX_W,
    annotator_value,
    display_scale,
    display_size,
    from_display,
    panel_from_snapshot,
    to_display,
)
from tests.ui_fakes import as_raw, drawn, model_box, pause, snapshot

BIG = ImageRef(sha256="cd" * 32, width=4032, height=3024, url="/api/v1/artifacts/big.jpg")
ODD = ImageRef(sha256="ef" * 32, width=2999, height=1001, url="/api/v1/artifacts/odd.png")


def big_panel(image: ImageRef = BIG):
    boxes = [
        model_box(1, (10.37, 20.5, 1110.25, 990.75)),
        model_box(2, (2000.0, 333.3, 2999.0, 1001.0), "sock", 0.55),  # to the corner of ODD
        model_box(3, (0.0, 0.0, 1.0, 1.0), "dot", 0.4),
    ]
    snap = snapshot(boxes=boxes, active=pause()).model_copy(update={"image": image})
    panel = panel_from_snapshot(snap)
    assert panel is not None
    return panel


def test_display_size_keeps_small_images_and_scales_wide_ones():
    assert display_size(640, 480) == (640, 480) and display_size(DISPLAY_MAX_W, 7) == (DISPLAY_MAX_W, 7)
    assert display_size(4032, 3024) == (1280, 960)
    assert display_size(2999, 1001) == (1280, 427)
    assert display_scale(ImageRef(sha256="0" * 64, width=640, height=480, url="u")) == (1.0, 1.0)


@pytest.mark.parametrize("image", [BIG, ODD])
@pytest.mark.parametrize("canvas", [1.0, 0.6251, 0.37, 1.7])  # the annotator's own scaleFactor
def test_untouched_boxes_come_back_exactly(image, canvas):
    panel = big_panel(image)
    value = annotator_value(panel, "/x/img.jpg")
    dw, dh = display_size(image.width, image.height)
    for b in value["boxes"]:  # in pixels of the display image
        assert 0 <= b["xmin"] <= b["xmax"] <= dw + 1e-9 and 0 <= b["ymin"] <= b["ymax"] <= dh + 1e-9
    raw = as_raw(value, scale=canvas)
    got = read_annotator(panel, raw)
    assert [d.bbox for d in got] == [pb.box.bbox for pb in panel.boxes]  # byte-identical, not approximately
    assert edits_between(panel, got).is_empty()
    subjects, err = subjects_from_annotator(panel, raw)
    assert err is None and [s["bbox"] for s in subjects] == [list(pb.box.bbox) for pb in panel.boxes]


def test_a_moved_or_drawn_box_is_read_in_original_pixels():
    panel = big_panel()
    sx, sy = display_scale(BIG)
    value = annotator_value(panel, "/x/img.jpg")
    raw = as_raw(value, scale=0.5)
    first = raw["boxes"][0]
    for k in ("xmin", "xmax"):
        first[k] += 10 * 0.5  # dragged 10 display pixels right
    raw["boxes"].insert(0, drawn(100, 100, 200, 150, "new: bag", scale=0.5))
    got = read_annotator(panel, raw)
    moved = got[1].bbox
    assert moved is not None and moved[0] - 10.37 == pytest.approx(10 / sx, abs=0.5)
    assert moved[2] - moved[0] == pytest.approx(1110.25 - 10.37)  # a shift keeps its exact size
    assert got[0].bbox == (round(100 / sx), round(100 / sy), round(200 / sx), round(150 / sy))
    ed = edits_between(panel, got)
    assert list(ed.moved) == ["box_1"] and ed.added == [(got[0].bbox, "bag")]


def test_a_label_set_keeps_every_box_where_it_was():
    panel = big_panel()
    raw = as_raw(annotator_value(panel, "/x/img.jpg"), scale=0.8)
    raw["boxes"].insert(0, drawn(100, 100, 200, 150, "", scale=0.8))
    value, _, err = apply_label(panel, raw, {}, "auto", "bag", "/x/img.jpg")
    assert err is None and value is not None
    again = read_annotator(panel, as_raw(value, scale=0.8))
    assert [d.bbox for d in again[1:]] == [pb.box.bbox for pb in panel.boxes]
    assert again[0].new_label == "bag" and again[0].bbox == read_annotator(panel, raw)[0].bbox


def test_to_and_from_display_are_inverse():
    for bbox in [(10.37, 20.5, 1110.25, 990.75), (0.0, 0.0, 4032.0, 3024.0)]:
        back = from_display(BIG, to_display(BIG, bbox))
        assert back == pytest.approx(list(bbox), abs=1e-9)


def test_the_display_copy_is_a_jpeg_at_display_size_made_once(tmp_path: Path):
    store = ImageStore(tmp_path)
    big = tmp_path / "big.png"
    Image.new("RGBA", (3000, 1000), (10, 200, 30, 255)).save(big)
    shown = store.display(big, "aa" * 32, 3000, 1000)
    with Image.open(shown) as im:
        assert im.format == "JPEG" and im.size == display_size(3000, 1000) == (1280, 427)
    assert store.display(big, "aa" * 32, 3000, 1000) == shown and shown.stat().st_size < big.stat().st_size
    small = tmp_path / "small.png"
    Image.new("RGB", (640, 480), (200, 10, 30)).save(small)
    with Image.open(store.display(small, "bb" * 32, 640, 480)) as im:
        assert im.format == "JPEG" and im.size == (640, 480)
