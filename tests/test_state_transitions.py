"""The transition table and the pure decider functions (no Redis).

Pairs are generated from ``JobStatus`` x ``JobStatus`` so a state added to the
enum without a row in the table, or an edge added by mistake, shows up here.
"""

from __future__ import annotations

import itertools

import pytest

from hitl_review.statecore import decide
from hitl_review.statecore.decide import NextHop, RoundDecision, decide_round, diff_subjects, next_hop
from hitl_review.statecore.errors import IllegalTransition, InvalidRequest, JobCancelled
from hitl_review.statecore.models import Box, Subject, Validation
from hitl_review.statecore.states import (
    POLICY_EDGES,
    TERMINAL,
    TRANSITIONS,
    WAITING,
    JobStatus,
    is_terminal,
    is_waiting,
    transition,
)

S = JobStatus
ALL = list(JobStatus)
PAIRS = [(a, b) for a, b in itertools.product(ALL, ALL) if a != b]
ALLOWED = [(a, b) for a, b in PAIRS if b in TRANSITIONS[a]]
DISALLOWED = [(a, b) for a, b in PAIRS if b not in TRANSITIONS[a]]

# The table of docs/protocol.md § Transitions, written out once more independently of statecore, so a
# wrong edge in TRANSITIONS cannot make the generated cases agree with itself.
SPEC_TABLE = {
    "CREATED": "DETECTING CANCELLED FAILED",
    "DETECTING": "WAITING_USER_SELECTION PROCESSING_APPROVED_SUBJECTS FAILED CANCELLED TIMED_OUT",
    "WAITING_USER_SELECTION": "VALIDATING_MANUAL_BOXES PROCESSING_APPROVED_SUBJECTS EMPTY_SELECTION FAILED CANCELLED",
    "VALIDATING_MANUAL_BOXES": "WAITING_BOX_BATCH_REVISION PROCESSING_APPROVED_SUBJECTS FINALIZING_RESULTS FAILED "
    "CANCELLED TIMED_OUT",
    "WAITING_BOX_BATCH_REVISION": "VALIDATING_MANUAL_BOXES PROCESSING_APPROVED_SUBJECTS FINALIZING_RESULTS "
    "EMPTY_SELECTION FAILED CANCELLED",
    "PROCESSING_APPROVED_SUBJECTS": "WAITING_MASK_REVIEW FINALIZING_RESULTS FAILED CANCELLED TIMED_OUT",
    "WAITING_MASK_REVIEW": "PROCESSING_APPROVED_SUBJECTS FINALIZING_RESULTS FAILED CANCELLED",
    "FINALIZING_RESULTS": "SUCCEEDED PARTIAL_SUCCEEDED FAILED CANCELLED TIMED_OUT",
}


def _id(p):
    return f"{p[0].value}->{p[1].value}"


def test_table_matches_spec():
    assert {s.value for s in ALL} == {
        "CREATED",
        "DETECTING",
        "WAITING_USER_SELECTION",
        "VALIDATING_MANUAL_BOXES",
        "WAITING_BOX_BATCH_REVISION",
        "PROCESSING_APPROVED_SUBJECTS",
        "WAITING_MASK_REVIEW",
        "FINALIZING_RESULTS",
        "SUCCEEDED",
        "PARTIAL_SUCCEEDED",
        "FAILED",
        "EMPTY_SELECTION",
        "CANCELLED",
        "TIMED_OUT",
    }
    assert {t.value for t in TERMINAL} == {
        "SUCCEEDED",
        "PARTIAL_SUCCEEDED",
        "FAILED",
        "EMPTY_SELECTION",
        "CANCELLED",
        "TIMED_OUT",
    }
    assert set(TRANSITIONS) == set(ALL), "every state needs a row, terminal ones an empty one"
    for state in ALL:
        want = set(SPEC_TABLE.get(state.value, "").split())
        assert {t.value for t in TRANSITIONS[state]} == want, state


@pytest.mark.parametrize("pair", ALLOWED, ids=_id)
def test_allowed(pair):
    cur, tgt = pair
    # The policy edge is taken only by a named auto-approve policy (tests/test_auto_approve.py).
    by = "policy:box@0123456789abcdef" if pair in POLICY_EDGES else None
    assert transition(cur, tgt, job_id="job_x", by_policy=by) == tgt
    assert transition(cur.value, tgt.value, by_policy=by) == tgt  # the string form read from Redis


@pytest.mark.parametrize("pair", DISALLOWED, ids=_id)
def test_disallowed_raises(pair):
    cur, tgt = pair
    expected = JobCancelled if cur == S.CANCELLED else IllegalTransition
    with pytest.raises(expected) as ei:
        transition(cur, tgt, job_id="job_x")
    assert ei.value.job_id == "job_x"
    assert cur.value in ei.value.message or cur == S.CANCELLED
    assert tgt.value in ei.value.message


@pytest.mark.parametrize("state", ALL, ids=lambda s: s.value)
def test_same_state_is_noop(state):
    assert transition(state, state) is state


@pytest.mark.parametrize("state", sorted(TERMINAL), ids=lambda s: s.value)
def test_terminal_has_no_exit(state):
    assert TRANSITIONS[state] == frozenset()
    assert is_terminal(state) and is_terminal(state.value)
    for tgt in ALL:
        if tgt != state:
            with pytest.raises((IllegalTransition, JobCancelled)):
                transition(state, tgt)


@pytest.mark.parametrize("tgt", [s for s in ALL if s != S.CANCELLED], ids=lambda s: s.value)
def test_cancelled_never_moves(tgt):
    with pytest.raises(JobCancelled) as ei:
        transition(S.CANCELLED, tgt, job_id="job_c")
    assert ei.value.code == "JOB_CANCELLED" and ei.value.status == 409


def test_waiting_states_never_time_out_and_live_states_can_be_cancelled():
    assert WAITING == {S.WAITING_USER_SELECTION, S.WAITING_BOX_BATCH_REVISION, S.WAITING_MASK_REVIEW}
    for w in WAITING:
        assert is_waiting(w) and not is_terminal(w)
        assert S.TIMED_OUT not in TRANSITIONS[w]
        with pytest.raises(IllegalTransition):
            transition(w, S.TIMED_OUT)
    for s in ALL:
        if s not in TERMINAL:
            assert S.CANCELLED in TRANSITIONS[s] and not is_terminal(s)
            assert transition(s, S.CANCELLED) == S.CANCELLED


def test_every_live_state_reaches_a_terminal_state():
    """No live state is a dead end of the graph: a job can always finish."""
    for start in ALL:
        seen, frontier = {start}, [start]
        while frontier:
            cur = frontier.pop()
            for nxt in TRANSITIONS[cur]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL or start in TERMINAL


# --------------------------------------------------------------------------- diff_subjects


def _box(i: int, source: str = "model", validation: Validation | None = None, label: str = "shoe") -> Box:
    return Box(
        box_id=f"box_{i}",
        bbox=(10.0 * i, 10.0, 10.0 * i + 5, 20.0),
        label=label,
        score=0.9 if source == "model" else None,
        source=source,
        validation=validation,
    )


PANEL = [
    _box(1),
    _box(2),
    _box(3, source="manual", validation=Validation(status="PASSED", score=0.8)),
    _box(4, source="manual", validation=Validation(status="NEEDS_REVISION", score=0.1, reason="blurry")),
]


def _counter():
    n = iter(range(1000))
    return lambda: f"box_new{next(n)}"


def test_diff_keeps_moves_relabels_adds_and_deletes():
    subjects = [
        Subject(box_id="box_1", bbox=(10, 10, 15, 20)),  # unchanged
        Subject(box_id="box_2", bbox=(0, 0, 50, 50), label="bag"),  # moved + relabelled
        Subject(candidate_id="box_3", bbox=(30, 10, 35, 20)),  # candidate_id names a box
        Subject(bbox=(100, 100, 200, 200), label="hat"),  # new manual box
        Subject(candidate_id="cand_unknown", bbox=(1, 1, 2, 2)),  # unknown candidate -> new box
    ]
    d = diff_subjects(PANEL, subjects, new_box_id=_counter())
    assert d.kept == ["box_1", "box_2", "box_3"]
    assert d.added == ["box_new0", "box_new1"]
    assert d.deleted == ["box_4"]
    by_id = {b.box_id: b for b in d.box_list}
    assert [b.box_id for b in d.box_list] == ["box_1", "box_2", "box_3", "box_new0", "box_new1"]
    assert by_id["box_2"].bbox == (0, 0, 50, 50) and by_id["box_2"].label == "bag"
    assert by_id["box_2"].source == "model" and by_id["box_2"].score == 0.9
    assert by_id["box_1"].label == "shoe", "no label given keeps the old label"
    assert by_id["box_3"].validation.status == "PASSED", "an unchanged manual box keeps its verdict"
    new = by_id["box_new0"]
    assert new.source == "manual" and new.validation is None and new.score is None and new.label == "hat"
    assert new.target_policy == "SEGMENT"


def test_diff_changed_manual_box_loses_its_verdict_model_box_does_not():
    moved_manual = Subject(box_id="box_3", bbox=(31, 10, 35, 20))
    relabelled_manual = Subject(box_id="box_4", bbox=(40, 10, 45, 20), label="other")
    d = diff_subjects(PANEL, [moved_manual, relabelled_manual])
    assert [b.validation for b in d.box_list] == [None, None]
    model_box = PANEL[0].model_copy(update={"validation": Validation(status="PASSED")})
    d2 = diff_subjects([model_box], [Subject(box_id="box_1", bbox=(0, 0, 1, 1))])
    assert d2.box_list[0].validation.status == "PASSED"


def test_diff_new_ids_for_every_manual_box():
    d = diff_subjects(PANEL, [Subject(bbox=(1, 1, 5, 5)), Subject(bbox=(1, 1, 5, 5))])
    ids = [b.box_id for b in d.box_list]
    assert len(set(ids)) == 2 and all(i.startswith("box_") and i not in {b.box_id for b in PANEL} for i in ids)
    assert d.kept == [] and d.deleted == [b.box_id for b in PANEL]
    # Unlabelled manual boxes are not approved as sent: they go to the validator to be named first
    # (docs/protocol.md § Second round), their target_policy SEGMENT when none was given.
    assert all(b.label is None and b.validation is None and b.target_policy == "SEGMENT" for b in d.box_list)
    assert decide.approved_of(d.box_list) == []
    assert next_hop(d.box_list) == NextHop.VALIDATE_MANUAL_BOX_LIST


def test_diff_empty_selection_deletes_all():
    d = diff_subjects(PANEL, [])
    assert d.box_list == [] and d.kept == [] and d.added == []
    assert d.deleted == [b.box_id for b in PANEL]


@pytest.mark.parametrize(
    "subjects",
    [
        [Subject(box_id="box_999", bbox=(1, 1, 2, 2))],
        [Subject(box_id="box_1", bbox=(1, 1, 2, 2)), Subject(box_id="box_1", bbox=(1, 1, 3, 3))],
        [Subject(box_id="box_1", bbox=(1, 1, 2, 2)), Subject(candidate_id="box_1", bbox=(1, 1, 3, 3))],
    ],
    ids=["unknown", "duplicate", "duplicate-via-candidate"],
)
def test_diff_unknown_or_duplicate_ids_are_400(subjects):
    with pytest.raises(InvalidRequest) as ei:
        diff_subjects(PANEL, subjects)
    assert ei.value.status == 400 and ei.value.code == "INVALID_REQUEST"
    assert "subjects[" in ei.value.message


# --------------------------------------------------------------------------- next_hop / decide_round


def test_next_hop():
    assert next_hop([]) == NextHop.EMPTY_SELECTION
    assert next_hop([_box(1), _box(2)]) == NextHop.PROCESS_APPROVED_BOX_LIST
    assert next_hop([_box(1), _box(5, source="manual")]) == NextHop.VALIDATE_MANUAL_BOX_LIST
    passed = _box(5, source="manual", validation=Validation(status="PASSED"))
    assert next_hop([passed]) == NextHop.PROCESS_APPROVED_BOX_LIST, "passed boxes are not validated again"
    revise = _box(5, source="manual", validation=Validation(status="NEEDS_REVISION"))
    assert next_hop([passed, revise]) == NextHop.VALIDATE_MANUAL_BOX_LIST


def test_approved_of_skips_unvalidated_rejected_and_skip_policy():
    boxes = [
        _box(1),
        _box(2).model_copy(update={"target_policy": "SKIP"}),
        _box(3, source="manual", validation=Validation(status="PASSED")),
        _box(4, source="manual", validation=Validation(status="REJECTED")),
        _box(5, source="manual"),
    ]
    assert [b.box_id for b in decide.approved_of(boxes)] == ["box_1", "box_3"]


P, F = Validation(status="PASSED", score=0.9), Validation(status="NEEDS_REVISION", score=0.1)


@pytest.mark.parametrize(
    "round_,results,want",
    [
        (1, [P, P], RoundDecision.ALL_PASSED),
        (1, [P, F], RoundDecision.NEED_BATCH_REVISION),
        (1, [F], RoundDecision.NEED_BATCH_REVISION),
        (1, [], RoundDecision.ALL_PASSED),
        (2, [F, F], RoundDecision.ALL_REJECTED),
        (2, [F], RoundDecision.ALL_REJECTED),
        (2, [P, F], RoundDecision.PARTIAL_APPROVED),
        (2, [P, P], RoundDecision.ALL_PASSED),
        (2, [], RoundDecision.ALL_PASSED),
        (3, [F], RoundDecision.ALL_REJECTED),
    ],
)
def test_decide_round(round_, results, want):
    assert decide_round(round_, results) == want


def test_round_two_never_asks_again():
    for results in itertools.product([P, F, Validation(status="REJECTED")], repeat=3):
        assert decide_round(2, list(results)) != RoundDecision.NEED_BATCH_REVISION
