"""A validator's answer must name exactly the boxes it was asked about (docs/protocol.md § Error
codes: ``INVALID_NODE_OUTPUT``): one verdict per box of the node's ``items_to_validate``. A verdict
missing (the manual box would silently drop out of the results), one for a box it was not asked
about, or two for one box fail the node at once, not retried, and the job ends ``FAILED`` with
``INVALID_NODE_OUTPUT``, like an output that does not parse. Real redis-server and Store; the
validator's part is played through the store (``tests.helpers``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hitl_review.statecore.states import JobStatus as S

from .helpers import iv, keep, manual, report, validate, waiting_job


def _verdict(box_id: str, passed: bool = True) -> dict[str, Any]:
    return {"box_id": box_id, "passed": passed, "score": 0.9 if passed else 0.1, "reason": None}


async def _validating(store: Any, image: Any) -> tuple[str, str, str, str]:
    """A job validating two manual boxes (and keeping a model box): (job, model box, manual a, b)."""
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    subjects = keep(st, 0) + [manual([300, 300, 400, 400], "a"), manual([500, 300, 600, 400], "b")]
    body = json.loads((await store.intervene(job_id, iv(st, subjects), "rev")).body)
    assert body["next_node_type"] == "VALIDATE_MANUAL_BOX_LIST"
    a, b = body["diff"]["added"]
    return job_id, st.box_list[0].box_id, a, b


BAD_ANSWERS = {
    "a-verdict-missing": lambda model, a, b: [_verdict(a)],
    "an-unknown-box": lambda model, a, b: [_verdict(a), _verdict(b), _verdict("box_00000000000000000000")],
    "a-box-not-asked-about": lambda model, a, b: [_verdict(a), _verdict(b), _verdict(model)],
    "a-box-twice": lambda model, a, b: [_verdict(a), _verdict(b), _verdict(b, passed=False)],
    "no-verdicts-at-all": lambda model, a, b: [],
}


@pytest.mark.parametrize("case", sorted(BAD_ANSWERS))
async def test_an_answer_that_does_not_match_the_boxes_asked_fails_the_job(store, image, case):
    job_id, model, a, b = await _validating(store, image)
    before = await store.get(job_id)
    assert await report(store, job_id, {"results": BAD_ANSWERS[case](model, a, b)}) == "OK"
    st = await store.get(job_id)
    assert (st.status, st.reason_code) == (S.FAILED, "INVALID_NODE_OUTPUT"), case
    assert st.current_node is not None and st.current_node.status == "FAILED"
    # Nothing of the answer was taken: the boxes keep what they had before it.
    assert [bx.model_dump() for bx in st.box_list] == [bx.model_dump() for bx in before.box_list]
    events = await store.events_after(job_id)
    (done,) = [e for e in events if e.type == "NODE_COMPLETED" and e.data["node_type"] == "VALIDATE_MANUAL_BOX_LIST"]
    assert done.data["outcome"] == "FAILED" and done.data["error_code"] == "INVALID_NODE_OUTPUT"
    print(f"\n[{case}] {done.data['error_message']}")
    assert "asked about" in done.data["error_message"]
    assert events[-1].type == "JOB_FINISHED" and events[-1].data["reason_code"] == "INVALID_NODE_OUTPUT"
    assert [c.node_type for c in await store.outbox_commands(job_id)][-1] == "VALIDATE_MANUAL_BOX_LIST"


async def test_an_answer_in_another_order_is_taken(store, image):
    job_id, model, a, b = await _validating(store, image)
    assert await report(store, job_id, {"results": [_verdict(b), _verdict(a)]}) == "OK"
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    assert [bx.box_id for bx in st.approved_box_list] == [model, a, b]


async def test_round_two_asks_only_the_box_to_revise_and_checks_against_it(store, image):
    job_id = await waiting_job(store, image)
    st1 = await store.get(job_id)
    subjects = [manual([300, 300, 400, 400], "ok"), manual([500, 300, 600, 400], "bad")]
    body = json.loads((await store.intervene(job_id, iv(st1, subjects), "rev")).body)
    good, bad = body["diff"]["added"]
    assert await validate(store, job_id, {good: True, bad: False}) == "OK"
    st2 = await store.get(job_id)
    assert st2.status == S.WAITING_BOX_BATCH_REVISION
    keep_all = [{"box_id": bx.box_id, "bbox": list(bx.bbox)} for bx in st2.box_list]
    await store.intervene(job_id, iv(st2, keep_all), "rev")
    # The passed box is reused, not asked about again: a verdict for it is not an answer to this node.
    assert await validate(store, job_id, {bad: True, good: True}) == "OK"
    st3 = await store.get(job_id)
    assert (st3.status, st3.reason_code) == (S.FAILED, "INVALID_NODE_OUTPUT")
