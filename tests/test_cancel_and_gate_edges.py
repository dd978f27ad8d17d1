"""Edges of a cancel and of the quality gate against a real redis-server (issue 35, items 5-7).

- A cancelled job's subjects are finished too (SPEC §13): each subject still to cut, being cut,
  retried, refined or in a mask review is ``CANCELLED``, in the cancel's own write; those already
  decided keep their result.
- A cancelled job's own node ends ``CANCELLED`` whatever live state it was in, ``RETRY_WAIT``
  included: no dispatcher runs it and no index names it.
- Under ``--quality-gate review-failing`` a mask without a verdict (the gate raised, timed out, or
  never ran) waits for a person, with a reason saying so: the gate fails closed. ``off`` records only.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest_asyncio

from harness.executor import report
from hitl_review.serve_app.work.inspector import Inspector
from hitl_review.statecore import keys
from hitl_review.statecore.models import InterventionRequest, NodeCommand, NodeReport
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import iv, keep, waiting_job

FINISHED_SUBJECT = {"SUCCEEDED", "REJECTED", "FAILED", "CANCELLED"}
FAIL = {"verdict": "FAIL", "reasons": ["cut off at the box edge"], "scores": {"cut_off": 0.4}, "policy": "gate-v1"}
PASS = {"verdict": "PASS", "reasons": [], "scores": {"fill": 0.6}, "policy": "gate-v1"}


async def _store(url: str, mode: str = "off") -> Store:
    # retry_backoff_s > 0: a lost node is re-dispatched after a backoff (RETRY_WAIT).
    cfg = StoreConfig(retention_s=3600, node_timeout_s=60, retry_backoff_s=30.0, quality_gate=mode)
    s = Store.from_url(url, cfg)
    await s.r.flushdb()
    await s.ensure_groups()
    return s


@pytest_asyncio.fixture
async def store(redis_server):
    s = await _store(redis_server.url)
    yield s
    await s.close()


@pytest_asyncio.fixture
async def gated(redis_server):
    s = await _store(redis_server.url, "review-failing")
    yield s
    await s.close()


async def _lose(store: Store) -> None:
    """The executors of the running nodes vanish (nobody beats): the inspector re-dispatches each
    after a backoff (its replacement ``RETRY_WAIT``)."""
    await asyncio.sleep(0.2)
    counts = await Inspector(store, owner="i1", heartbeat_lapse_s=0.1).sweep()
    assert counts["lost"] == 1, counts


async def _members(store: Store, job_id: str) -> list[str]:
    """Every member of the live indices (queued, running, heartbeats) naming ``job_id`` or its nodes."""
    p = keys.partition_of(job_id)
    out = []
    for index in (keys.queued(p), keys.running(p), keys.heartbeats(p)):
        out += [m for m in await store.r.zrange(index, 0, -1) if keys.split_member(m)[0] == job_id]
    return out


async def _cmd(store: Store, job_id: str, nid: str) -> NodeCommand:
    (cmd,) = [c for c in await store.outbox_commands(job_id) if c.node_instance_id == nid]
    return cmd


# --------------------------------------------------------------------------- item 5


async def test_a_cancel_finishes_every_live_subject_and_keeps_the_decided_ones(store, image) -> None:
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, 0, 1, 2)), "rev")
    st = await store.get(job_id)
    a, b, c = (bx.box_id for bx in st.approved_box_list)
    nodes = {n.box_id: n.node_instance_id for n in st.subject_nodes.values()}
    for box in (a, b):
        assert await store.node_started(await _cmd(store, job_id, nodes[box])) == "OK"
    cut = {"box_id": a, "status": "SUCCEEDED", "mask": "m.png", "cutout": "c.png"}
    answer = NodeReport(
        node_instance_id=nodes[a],
        node_type="SEGMENT_SUBJECT",
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"subjects": [cut]},
    )
    assert await store.apply_report(answer) == "OK"  # a is cut (b runs, c is queued)
    await _lose(store)  # b's executor is lost: its retry waits out a backoff
    st = await store.get(job_id)
    assert {r.box_id: r.status for r in st.results} == {a: "SUCCEEDED", b: "SEGMENTING", c: "QUEUED"}
    assert sorted(n.status for n in st.subject_nodes.values()) == ["QUEUED", "RETRY_WAIT"]

    snap = await store.cancel(job_id, "alice")

    assert snap.status == S.CANCELLED
    assert {s.box_id: s.status for s in snap.subjects} == {a: "SUCCEEDED", b: "CANCELLED", c: "CANCELLED"}
    done = await store.get(job_id)  # what GET /jobs/{id}/results answers
    assert {r.box_id: r.status for r in done.results} == {a: "SUCCEEDED", b: "CANCELLED", c: "CANCELLED"}
    assert done.version == snap.version  # in the cancel's own write
    assert {n.status for n in done.subject_nodes.values()} == {"CANCELLED"}
    assert await _members(store, job_id) == []
    for nid in (n.node_instance_id for n in done.subject_nodes.values()):
        assert await store.node_status(job_id, nid) == "CANCELLED"


async def test_a_cancel_finishes_subjects_in_a_mask_review_and_being_refined(gated, image) -> None:
    async def segmented(qualities: list[dict]) -> tuple[str, list[str]]:
        job_id = await waiting_job(gated, image)
        st = await gated.get(job_id)
        await gated.intervene(job_id, iv(st, keep(st, *range(len(qualities)))), "rev")
        ids = [b.box_id for b in (await gated.get(job_id)).approved_box_list]
        subjects = [
            {"box_id": b, "status": "SUCCEEDED", "mask": f"m{n}.png", "cutout": f"c{n}.png", "quality": q}
            for n, (b, q) in enumerate(zip(ids, qualities, strict=True))
        ]
        assert await report(gated, job_id, {"subjects": subjects}) == "OK"
        return job_id, ids

    reviewing, (good, bad) = await segmented([PASS, FAIL])
    assert {r.box_id: r.status for r in (await gated.get(reviewing)).results} == {
        good: "SUCCEEDED",
        bad: "WAITING_REVIEW",
    }
    snap = await gated.cancel(reviewing, "alice")
    assert {s.box_id: s.status for s in snap.subjects} == {good: "SUCCEEDED", bad: "CANCELLED"}

    refining, (x, y) = await segmented([FAIL, FAIL])
    st = await gated.get(refining)
    p = st.active_pause
    decisions = [
        {"box_id": x, "decision": "REFINE", "points": [{"x": 20, "y": 20, "positive": True}]},
        {"box_id": y, "decision": "ACCEPT"},
    ]
    req = InterventionRequest(
        intervention_id=f"iv_{uuid.uuid4().hex[:12]}",
        pause_token=p.pause_token,
        base_version=st.version,
        snapshot_id=p.snapshot_id,
        decisions=decisions,
    )
    assert (await gated.intervene(refining, req, "lena")).status_code == 200
    assert {r.box_id: r.status for r in (await gated.get(refining)).results} == {x: "REFINING", y: "SUCCEEDED"}
    await gated.cancel(refining, "alice")
    done = await gated.get(refining)
    assert {r.box_id: r.status for r in done.results} == {x: "CANCELLED", y: "SUCCEEDED"}
    assert all(r.status in FINISHED_SUBJECT for r in done.results)
    assert await _members(gated, refining) == []


# --------------------------------------------------------------------------- item 7


async def test_a_cancel_ends_the_jobs_own_node_waiting_to_retry(store, image) -> None:
    job_id = (await store.create_job("alice", image)).job_id
    first = (await store.get(job_id)).current_node.node_instance_id
    assert await store.node_started(await _cmd(store, job_id, first)) == "OK"
    await _lose(store)
    st = await store.get(job_id)
    retry = st.current_node
    assert st.status == S.DETECTING and retry.status == "RETRY_WAIT" and retry.node_instance_id != first
    assert job_id in await _members(store, job_id)  # queued again, behind its backoff

    snap = await store.cancel(job_id, "alice")

    assert snap.status == S.CANCELLED
    assert snap.current_node is not None and snap.current_node.node_instance_id == retry.node_instance_id
    assert snap.current_node.status == "CANCELLED"
    assert await _members(store, job_id) == []  # nothing for the inspector or a dispatcher to pick up
    # The dispatcher's check before it runs a command: not QUEUED / RETRY_WAIT, so it is not run.
    assert await store.node_status(job_id, retry.node_instance_id) == "CANCELLED"
    assert await store.node_started(await _cmd(store, job_id, retry.node_instance_id)) != "OK"
    assert (await store.get(job_id)).version == snap.version


# --------------------------------------------------------------------------- item 6


async def _cut_without_verdict(store: Store, image, verdicts: list[dict | None]) -> tuple[str, list[str]]:
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, *range(len(verdicts)))), "rev")
    ids = [b.box_id for b in (await store.get(job_id)).approved_box_list]
    subjects = []
    for n, (b, q) in enumerate(zip(ids, verdicts, strict=True)):
        s = {"box_id": b, "status": "SUCCEEDED", "mask": f"m{n}.png", "cutout": f"c{n}.png"}
        subjects.append({**s, "quality": q} if q is not None else s)
    assert await report(store, job_id, {"subjects": subjects}) == "OK"
    return job_id, ids


async def test_a_mask_the_gate_gave_no_verdict_on_waits_for_a_person(gated, image) -> None:
    job_id, (judged, unjudged) = await _cut_without_verdict(gated, image, [PASS, None])
    st = await gated.get(job_id)
    assert st.status == S.WAITING_MASK_REVIEW  # fail-closed: nobody vouched for the second mask
    pause = st.active_pause
    assert pause is not None and pause.status == "WAITING" and pause.stage == "WAITING_MASK_REVIEW"
    (listed,) = pause.subjects_to_review or []
    assert listed.box_id == unjudged and listed.quality is None
    assert listed.reason is not None and "no verdict" in listed.reason
    by_id = {r.box_id: r for r in st.results}
    assert (by_id[judged].status, by_id[judged].decided_by) == ("SUCCEEDED", "gate")
    assert (by_id[unjudged].status, by_id[unjudged].decided_by) == ("WAITING_REVIEW", None)
    assert not [r for r in st.results if r.status == "SUCCEEDED" and r.quality is None]


async def test_under_off_a_mask_without_a_verdict_ships_as_before(store, image) -> None:
    job_id, _ = await _cut_without_verdict(store, image, [None, None])
    st = await store.get(job_id)
    assert st.status == S.FINALIZING_RESULTS and st.active_pause is None
    assert [(r.status, r.quality, r.decided_by) for r in st.results] == [("SUCCEEDED", None, None)] * 2
