"""One SEGMENT_SUBJECT node per approved subject (SPEC §13, statecore.subjects) against a real
redis-server: every subject queued in the approving write, each node its own instance, attempts and
report; a subject's failure (its model's, its attempts running out, a dead letter) fails that subject
alone and the next goes on; the job ends PARTIAL_SUCCEEDED; late, replayed and post-cancel reports
change nothing."""

from __future__ import annotations

import pytest_asyncio

from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import iv, keep, waiting_job


@pytest_asyncio.fixture
async def store(redis_server):
    s = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=60, retry_backoff_s=0.0))
    await s.r.flushdb()
    await s.ensure_groups()
    yield s
    await s.close()


def _cut(box_id: str, n: int) -> dict:
    return {"box_id": box_id, "status": "SUCCEEDED", "mask": f"m{n}.png", "cutout": f"c{n}.png"}


async def _approved(store: Store, image, n: int = 3) -> tuple[str, list[str]]:
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, *range(n))), "rev")
    st = await store.get(job_id)
    return job_id, [b.box_id for b in st.approved_box_list]


async def _node(store: Store, job_id: str):
    """The job's current node, its command and the subject its input names."""
    st = await store.get(job_id)
    node = st.current_node
    assert node is not None
    cmd = next(c for c in await store.outbox_commands(job_id) if c.node_instance_id == node.node_instance_id)
    return node, cmd, cmd.input["approved_box_list"][0]["box_id"] if cmd.input.get("approved_box_list") else None


async def _answer(store: Store, job_id: str, output: dict, outcome: str = "SUCCEEDED", **kw) -> tuple[str, str]:
    node, cmd, box = await _node(store, job_id)
    rep = NodeReport(
        node_instance_id=node.node_instance_id,
        node_type=node.node_type,
        job_id=job_id,
        outcome=outcome,
        output=output,
        **kw,
    )
    return await store.apply_report(rep), node.node_instance_id


async def test_approval_queues_every_subject_and_one_node_each(store, image) -> None:
    job_id, ids = await _approved(store, image)
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    # Written with the approval, in the same version: every subject QUEUED, one command for the first.
    assert [(r.box_id, r.status) for r in st.results] == [(b, "QUEUED") for b in ids]
    assert {s.box_id: s.status for s in st.snapshot().subjects} == dict.fromkeys(ids, "QUEUED")
    accepted = [e for e in await store.events_after(job_id) if e.type == "INTERVENTION_ACCEPTED"]
    assert accepted[-1].version == st.version and accepted[-1].data["next_node_type"] == "PROCESS_APPROVED_BOX_LIST"
    cmds = [c for c in await store.outbox_commands(job_id) if c.node_type == "SEGMENT_SUBJECT"]
    assert len(cmds) == 1 and accepted[-1].data["node_instance_id"] == cmds[0].node_instance_id
    assert [b["box_id"] for b in cmds[0].input["approved_box_list"]] == [ids[0]]

    seen_nodes = []
    for n, box in enumerate(ids):
        node, cmd, named = await _node(store, job_id)
        assert node.node_type == "SEGMENT_SUBJECT" and named == box and node.attempt == 0
        assert await store.node_started(cmd) == "OK"
        verdict, nid = await _answer(store, job_id, {"subjects": [_cut(box, n)], "backend": "classical"})
        assert verdict == "OK"
        seen_nodes.append(nid)
        st = await store.get(job_id)
        statuses = [r.status for r in st.results]
        assert statuses == ["SUCCEEDED"] * (n + 1) + ["QUEUED"] * (len(ids) - n - 1)
    assert len(set(seen_nodes)) == len(ids)  # its own node instance per subject
    assert st.status == S.FINALIZING_RESULTS
    segmented = [e.data["box_id"] for e in await store.events_after(job_id) if e.type == "SUBJECT_SEGMENTED"]
    assert segmented == ids
    assert (await _answer(store, job_id, {}))[0] == "OK"
    assert (await store.get(job_id)).status == S.SUCCEEDED


async def test_a_subject_its_model_fails_fails_alone_and_the_job_ends_partial(store, image) -> None:
    job_id, (a, b, c) = await _approved(store, image)
    assert (await _answer(store, job_id, {"subjects": [_cut(a, 0)]}))[0] == "OK"
    verdict, failed_nid = await _answer(
        store, job_id, {}, outcome="FAILED", error_code="MODEL_ERROR", error_message="CUDA out of memory"
    )
    assert verdict == "OK"
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS  # the job goes on
    by_id = {r.box_id: r for r in st.results}
    assert (by_id[b].status, by_id[b].reason) == ("FAILED", "MODEL_ERROR") and by_id[b].mask_url is None
    assert by_id[c].status == "QUEUED" and (await _node(store, job_id))[2] == c
    assert (await _answer(store, job_id, {"subjects": [_cut(c, 2)]}))[0] == "OK"
    assert (await _answer(store, job_id, {}))[0] == "OK"  # FINALIZE_RESULTS
    done = await store.get(job_id)
    assert done.status == S.PARTIAL_SUCCEEDED and done.reason_code == "SOME_SUBJECTS_FAILED"
    assert [r.status for r in done.results] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    # The failed subject's late answer after all: ignored, nothing changes.
    late = NodeReport(
        node_instance_id=failed_nid,
        node_type="SEGMENT_SUBJECT",
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"subjects": [_cut(b, 9)]},
    )
    assert await store.apply_report(late) == "DUPLICATE"
    assert (await store.get(job_id)).version == done.version


async def test_a_lost_attempt_retries_that_subject_alone_and_exhausted_attempts_fail_it(store, image) -> None:
    job_id, (a, b) = await _approved(store, image, n=2)
    assert (await _answer(store, job_id, {"subjects": [_cut(a, 0)]}))[0] == "OK"
    first_result = (await store.get(job_id)).results[0]
    nids = []
    for attempt in range(1, store.config.max_attempts + 1):
        node, cmd, box = await _node(store, job_id)
        assert box == b and node.attempt == attempt - 1
        assert await store.node_started(cmd) == "OK"
        nids.append(node.node_instance_id)
        assert await store.node_failed(job_id, node.node_instance_id, reason="EXECUTOR_LOST") == "OK"
        st = await store.get(job_id)
        assert st.results[0] == first_result  # the other subject is untouched
    assert len(set(nids)) == store.config.max_attempts  # a new instance per attempt, the same subject
    st = await store.get(job_id)
    # Out of attempts: that subject FAILED, not the job; nothing left, so the job finalises.
    assert st.status == S.FINALIZING_RESULTS
    assert [(r.status, r.reason) for r in st.results] == [("SUCCEEDED", None), ("FAILED", "EXECUTOR_LOST")]
    events = [e for e in await store.events_after(job_id) if e.data.get("node_type") == "SEGMENT_SUBJECT"]
    retries = [e for e in events if e.type == "NODE_RETRY_SCHEDULED"]
    assert len(retries) == store.config.max_attempts - 1
    # A superseded attempt's report arrives late: its instance already has its verdict (lost), so nothing.
    late = NodeReport(
        node_instance_id=nids[0],
        node_type="SEGMENT_SUBJECT",
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"subjects": [_cut(b, 7)]},
    )
    assert await store.apply_report(late) == "DUPLICATE"
    assert (await store.get(job_id)).results == st.results


async def test_a_dead_lettered_subject_fails_alone(store, image) -> None:
    job_id, (a, b) = await _approved(store, image, n=2)
    node, _cmd, box = await _node(store, job_id)
    assert box == a
    assert await store.node_dead_lettered(job_id, node.node_instance_id, reason="DELIVERY_LIMIT", actor="d") == "OK"
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    assert [(r.status, r.reason) for r in st.results] == [("FAILED", "DELIVERY_LIMIT"), ("QUEUED", None)]
    assert (await _node(store, job_id))[2] == b
    assert (await _answer(store, job_id, {}, outcome="TIMED_OUT", error_code="NODE_DEADLINE_EXCEEDED"))[0] == "OK"
    st = await store.get(job_id)
    assert st.status == S.FINALIZING_RESULTS and [r.status for r in st.results] == ["FAILED", "FAILED"]
    assert (await _answer(store, job_id, {}))[0] == "OK"
    done = await store.get(job_id)
    assert done.status == S.FAILED and done.reason_code == "ALL_SUBJECTS_FAILED"


async def test_replays_and_a_report_after_cancel_change_nothing(store, image) -> None:
    job_id, (a, b, c) = await _approved(store, image)
    node, _cmd, _ = await _node(store, job_id)
    rep = NodeReport(
        node_instance_id=node.node_instance_id,
        node_type="SEGMENT_SUBJECT",
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"subjects": [_cut(a, 0)]},
    )
    assert await store.apply_report(rep) == "OK"
    v = (await store.get(job_id)).version
    assert await store.apply_report(rep) == "DUPLICATE"  # a redelivery
    assert (await store.get(job_id)).version == v
    node_b, _cmd, box = await _node(store, job_id)
    assert box == b
    await store.cancel(job_id, "alice")
    cancelled = await store.get(job_id)
    assert cancelled.status == S.CANCELLED
    late = rep.model_copy(update={"node_instance_id": node_b.node_instance_id, "output": {"subjects": [_cut(b, 1)]}})
    assert await store.apply_report(late) == "IGNORED"
    after = await store.get(job_id)
    assert after.version == cancelled.version and after.results == cancelled.results
    assert not [
        x for x in await store.outbox_commands(job_id) if x.input.get("approved_box_list", [{}])[0].get("box_id") == c
    ]


async def test_nothing_approved_finishes_with_nothing_to_segment(store, image) -> None:
    """Every kept box marked SKIP: no subject to cut; the stage's one node of no box lets the job end."""
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    skipped = [{**s, "target_policy": "SKIP"} for s in keep(st, 0, 1)]
    reply = await store.intervene(job_id, iv(st, skipped), "rev")
    assert reply.status_code == 200
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS and st.results == [] and st.approved_box_list == []
    node, cmd, box = await _node(store, job_id)
    assert node.node_type == "PROCESS_APPROVED_BOX_LIST" and box is None
    assert (await _answer(store, job_id, {"subjects": []}))[0] == "OK"
    assert (await _answer(store, job_id, {}))[0] == "OK"
    done = await store.get(job_id)
    assert done.status == S.SUCCEEDED and done.reason_code == "NOTHING_TO_SEGMENT"
