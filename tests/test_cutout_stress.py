"""The cut-out set's stress knobs (``benchmarks/cutout_data.py``, ``cutout_stress.py``): boxes 10-25 %
loose per side, outlines and backgrounds the shipped gates never saw, scikit-image's real photographs,
each with a truth mask that fits its image."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.cutout_data import (
    LOOSE,
    NEW_BACKGROUNDS,
    NEW_SHAPES,
    STRESS_SPLITS,
    loose_box,
    make_sample,
    make_set,
)
from benchmarks.cutout_quality import subject_boxes
from benchmarks.cutout_stress import coins_truth, looseness, new_background, new_shape


@pytest.mark.parametrize("split", STRESS_SPLITS)
def test_stress_images_are_deterministic_with_tight_truth_that_leaves_room_for_loose_boxes(split: str) -> None:
    samples = make_set(split, 6, seed=5)
    assert len(samples) >= 5
    for s in samples:
        again = make_sample(split, s.index, 5)
        assert np.array_equal(s.image, again.image)
        h, w = s.image.shape[:2]
        assert s.image.dtype == np.uint8 and s.image.shape == (h, w, 3) and s.split == split
        for sub, other in zip(s.subjects, again.subjects, strict=True):
            assert np.array_equal(sub.mask, other.mask) and sub.mask.shape == (h, w) and sub.mask.sum() >= 80
            ys, xs = np.nonzero(sub.mask)
            assert sub.bbox == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
        for box, sub in zip(subject_boxes(s, 5, LOOSE), s.subjects, strict=True):
            sides = looseness(box, sub.bbox)  # never clipped by the frame on these splits
            assert all(LOOSE[0] - 1e-9 <= v <= LOOSE[1] + 1e-9 for v in sides), sides
    assert not np.array_equal(samples[0].image, make_sample(split, samples[0].index, 6).image)


def test_loose_boxes_are_loose_by_the_share_asked_and_clipped_to_the_frame() -> None:
    rng = np.random.default_rng(0)
    got = np.array([looseness(loose_box([100, 50, 200, 130], 400, 300, rng), [100, 50, 200, 130]) for _ in range(500)])
    assert got.min() >= 0.10 and got.max() <= 0.25 and got.max() - got.min() > 0.12  # spread over the range
    edge = loose_box([2, 2, 50, 40], 60, 45, rng, 0.2, 0.2)  # 9.6 px and 7.6 px wanted, 2 px there
    assert edge == pytest.approx([0.0, 0.0, 59.6, 45.0])


def test_new_outlines_backgrounds_and_photos_are_what_they_claim() -> None:
    rng = np.random.default_rng(1)
    for kind in NEW_SHAPES:
        m = new_shape(kind, 90, 80, rng)
        assert m.shape == (90, 80) and m.dtype == bool and 0.05 < m.mean() < 0.95, kind
    for kind in NEW_BACKGROUNDS:
        bg = new_background(kind, 60, 70, rng)
        assert bg.shape == (60, 70, 3) and np.isfinite(bg).all(), kind
    seen = {make_sample("new", i, 0).background for i in range(30)}
    assert seen <= set(NEW_BACKGROUNDS) and len(seen) >= 4
    labels = {sub.label for i in range(30) for sub in make_sample("new", i, 0).subjects}
    assert labels <= set(NEW_SHAPES) and len(labels) >= 8
    coins, lab = coins_truth()  # the derived truth: 24 coins, each one round blob
    assert coins.shape == lab.shape and lab.max() >= 24 and len(np.unique(lab)) == 25
    photos = [make_sample("photos", i, 0) for i in range(12)]
    assert {p.background for p in photos} == {"coins", "photo_cutout"}
    assert all(sub.label == "coin" for p in photos if p.background == "coins" for sub in p.subjects)
