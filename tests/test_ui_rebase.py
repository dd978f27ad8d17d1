"""ui.rebase: the reviewer's edits laid over the box list a 409 shows (docs/protocol.md § Rebase help)."""

from __future__ import annotations

from typing import Any

from hitl_review.ui.annotator import Edits
from hitl_review.ui.rebase import Changes, changes_between, rebase_edits, rebase_text, with_mine
from tests.ui_fakes import model_box, opened, round1, round2, shown, snapshot

A, B, C, D = "box_a", "box_b", "box_c", "box_d"
NOW = [A, B, C, D]


def rebase(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"base_version": 3, "version": 4, "base_found": True}
    body.update({"added": [], "removed": [], "moved": [], "relabelled": []})
    body.update(kw)
    return body


def test_edits_of_untouched_boxes_go_on_as_they_were() -> None:
    mine = Edits(deleted=[A], moved={B: (1, 1, 9, 9)}, relabelled={C: "boot"}, added=[((5, 5, 50, 50), "cap")])
    other = rebase(added=[{"box_id": "box_x", "bbox": [100, 100, 150, 150], "label": "bag"}])
    res = rebase_edits(mine, other, [*NOW, "box_x"])
    assert res.clean and res.duplicates == 0
    assert res.applied == mine
    assert "re-applied" in rebase_text(res) and "decision" not in rebase_text(res)


def test_a_box_someone_else_moved_or_relabelled_is_a_conflict_and_theirs_stays() -> None:
    mine = Edits(moved={A: (1, 1, 9, 9), B: (2, 2, 20, 20)}, relabelled={C: "boot"}, deleted=[D])
    other = rebase(
        moved=[
            {"box_id": A, "from": [0, 0, 10, 10], "to": [30, 30, 40, 40]},  # elsewhere: conflict
            {"box_id": B, "from": [0, 0, 10, 10], "to": [2.4, 2, 20, 19.6]},  # where I put it: agreement
            {"box_id": D, "from": [0, 0, 10, 10], "to": [5, 5, 15, 15]},  # I deleted what they moved
        ],
        relabelled=[{"box_id": C, "from": "shoe", "to": "sneaker"}],
    )
    res = rebase_edits(mine, other, NOW)
    assert {c.box_id for c in res.conflicts} == {A, C, D}
    assert res.applied.is_empty()  # B: both did the same; nothing left to apply
    assert res.mine.moved == {A: (1, 1, 9, 9)} and res.mine.relabelled == {C: "boot"} and res.mine.deleted == [D]
    text = rebase_text(res, {A: 1, C: 3, D: 4})
    assert "Needs your decision (3)" in text and "#1: you moved it, but meanwhile it was moved elsewhere" in text
    assert "“sneaker”" in text and "Re-apply my edits" in text
    both = with_mine(res)
    assert both.deleted == [D] and both.moved == {A: (1, 1, 9, 9)} and both.relabelled == {C: "boot"}


def test_a_box_removed_meanwhile() -> None:
    mine = Edits(deleted=[A], moved={B: (1, 1, 9, 9)}, relabelled={C: "boot"})
    other = rebase(removed=[{"box_id": A, "bbox": [0, 0, 1, 1]}, {"box_id": B}, {"box_id": C}])
    res = rebase_edits(mine, other, [D])
    # deleting a removed box is agreement; moving or naming one is a conflict nothing can apply
    assert [(c.box_id, c.theirs) for c in res.conflicts] == [(B, "removed"), (C, "removed")]
    assert res.applied.is_empty() and res.mine.is_empty()
    assert "Re-apply" not in rebase_text(res)


def test_same_label_agreement_and_moved_plus_relabelled_are_independent() -> None:
    mine = Edits(moved={A: (1, 1, 9, 9)}, relabelled={B: "boot"})
    other = rebase(relabelled=[{"box_id": A, "from": "shoe", "to": "bag"}, {"box_id": B, "from": "shoe", "to": "boot"}])
    res = rebase_edits(mine, other, NOW)
    assert res.clean and res.applied == Edits(moved={A: (1, 1, 9, 9)})


def test_a_drawn_box_someone_else_already_drew_is_not_drawn_twice() -> None:
    mine = Edits(added=[((10, 10, 50, 50), "cap"), ((60, 60, 90, 90), "hat")])
    other = rebase(added=[{"box_id": "box_x", "bbox": [10.5, 10, 50, 49.5], "label": "cap", "source": "manual"}])
    res = rebase_edits(mine, other, [*NOW, "box_x"])
    assert res.duplicates == 1 and res.applied.added == [((60, 60, 90, 90), "hat")]
    assert "not drawn twice" in rebase_text(res)


def test_without_a_base_or_with_a_malformed_body_only_existing_boxes_count() -> None:
    mine = Edits(deleted=[A, "box_gone"], moved={B: (1, 1, 9, 9)})
    for body in (None, {"base_found": False}, {"moved": [{"to": "x"}, 5], "removed": [None], "added": [{"bbox": 1}]}):
        res = rebase_edits(mine, body, NOW)
        assert res.applied == Edits(deleted=[A], moved={B: (1, 1, 9, 9)}) and res.clean
    assert not Changes.parse({"base_found": False}).found


def test_a_new_pause_seen_by_the_follower_is_rebased_from_the_boxes_the_page_saw() -> None:
    """Another reviewer's submission opens round 2 while this reviewer edits round 1: the follower's
    redraw carries their edits and the box-level change between the two panels (ui.session)."""
    st = opened(round1())
    panel = shown(st.panel)
    mine = Edits(deleted=["box_3"], relabelled={"box_1": "boot"}, added=[((5.0, 5.0, 60.0, 60.0), "cap")])
    st.canvas_changed(panel, mine)
    change = st.apply_snapshot(round2())  # box_1 kept, box_2/box_3 removed, box_4/box_5 added
    assert change.redraw and st.pending_rebase is not None
    edits, body = st.pending_rebase
    assert edits == mine
    assert {b["box_id"] for b in body["removed"]} == {"box_2", "box_3"}
    assert {b["box_id"] for b in body["added"]} == {"box_4", "box_5"} and body["moved"] == body["relabelled"] == []
    res = rebase_edits(edits, body, [pb.box_id for pb in shown(st.panel).boxes])
    assert res.clean and res.applied == Edits(relabelled={"box_1": "boot"}, added=[((5.0, 5.0, 60.0, 60.0), "cap")])


def test_changes_between_two_box_lists() -> None:
    old = [model_box(1), model_box(2, (200, 50, 300, 150), "sock")]
    new = [model_box(1, (12, 20, 110, 120), "boot"), model_box(2, (200.4, 50, 300, 150), "sock")]
    body = changes_between(old, new)
    assert body["moved"] == [{"box_id": "box_1", "from": [10.0, 20.0, 110.0, 120.0], "to": [12.0, 20.0, 110.0, 120.0]}]
    assert body["relabelled"] == [{"box_id": "box_1", "from": "shoe", "to": "boot"}]
    assert body["added"] == body["removed"] == []


def test_a_409_while_nothing_waits_rebases_onto_the_next_round_when_it_opens() -> None:
    st = opened(round1())
    mine = Edits(deleted=["box_2"], added=[((5.0, 5.0, 60.0, 60.0), "cap")])
    validating = snapshot(status="VALIDATING_MANUAL_BOXES", boxes=round1().box_list, actions=(), version=4)
    out = st.record_conflict("PAUSE_NOT_ACTIVE", validating, mine, rebased=True)
    assert st.panel is None and out.offer is None and st.pending_rebase is None
    st.apply_snapshot(round2())
    assert st.pending_rebase is not None and st.offer is None and st.carry is None
    edits, body = st.pending_rebase
    res = rebase_edits(edits, body, [pb.box_id for pb in shown(st.panel).boxes])
    assert res.clean and res.applied == Edits(added=[((5.0, 5.0, 60.0, 60.0), "cap")])  # box_2 is gone: agreed


def test_edits_survive_the_moment_between_two_rounds_when_nothing_waits() -> None:
    """Another reviewer submits while this one edits: the follower first sees the job in model work
    (no pause: the panel closes), then round 2. The edits are carried across and rebased onto it."""
    st = opened(round1())
    mine = Edits(deleted=["box_3"], relabelled={"box_1": "boot"}, added=[((5.0, 5.0, 60.0, 60.0), "cap")])
    st.canvas_changed(shown(st.panel), mine)
    validating = snapshot(status="VALIDATING_MANUAL_BOXES", boxes=round1().box_list, actions=(), version=5)
    gone = st.apply_snapshot(validating)
    assert st.panel is None and gone.banner == "Another reviewer submitted first." and st.pending_rebase is None
    change = st.apply_snapshot(round2())
    assert change.redraw and st.pending_rebase is not None and st.carry is None
    edits, body = st.pending_rebase
    assert edits == mine and {b["box_id"] for b in body["removed"]} == {"box_2", "box_3"}
    res = rebase_edits(edits, body, [pb.box_id for pb in shown(st.panel).boxes])
    assert res.clean and res.applied == Edits(relabelled={"box_1": "boot"}, added=[((5.0, 5.0, 60.0, 60.0), "cap")])
