"""The same protocol on a real 3-master Redis Cluster: every script stays in one
hash slot (no CROSSSLOT), jobs spread over the nodes, the outbox is readable."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import redis

from hitl_review.statecore import keys
from hitl_review.statecore.errors import (
    IdempotencyConflict,
    InvalidRequest,
    JobCancelled,
    JobTerminal,
    PauseNotActive,
    PauseTokenMismatch,
    VersionConflict,
)
from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.states import JobStatus as S

from .helpers import THREE_BOXES, create, footprint, iv, keep, manual, report, validate, waiting_job

pytestmark = pytest.mark.cluster


async def test_full_flow_on_cluster(cluster_store, image):
    store = cluster_store
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    assert st.status == S.WAITING_USER_SELECTION and st.version == 2
    req = iv(st, keep(st, 0) + [manual([300, 300, 400, 400], "mug")], iid="iv_c1")
    first = await store.intervene(job_id, req, "rev")
    body = json.loads(first.body)
    assert body["status"] == "VALIDATING_MANUAL_BOXES" and body["version"] == 3
    replay = await store.intervene(job_id, req, "rev")
    assert replay.replayed and replay.body == first.body
    (new_box,) = body["diff"]["added"]
    assert await validate(store, job_id, {new_box: False}) == "OK"
    st2 = await store.get(job_id)
    assert st2.status == S.WAITING_BOX_BATCH_REVISION and st2.active_pause.box_ids_to_revise == [new_box]
    hist = await store.pause_history(job_id)
    assert [h.status for h in hist] == ["CONSUMED"]
    await store.intervene(job_id, iv(st2, keep(st2, 0)), "rev")
    st3 = await store.get(job_id)
    assert st3.status == S.PROCESSING_APPROVED_SUBJECTS
    subj = [
        {"box_id": b.box_id, "status": "SUCCEEDED", "mask": "m.png", "cutout": "c.png"} for b in st3.approved_box_list
    ]
    assert await report(store, job_id, {"subjects": subj}) == "OK"
    assert await report(store, job_id, {}) == "OK"
    end = await store.get(job_id)
    assert end.status == S.SUCCEEDED and end.version == 7
    events = await store.events_after(job_id)
    assert [e.id for e in events] == list(range(1, len(events) + 1)) and events[-1].type == "JOB_FINISHED"
    assert [c.node_type for c in await store.outbox_commands(job_id)] == [
        "DETECT_SUBJECTS",
        "VALIDATE_MANUAL_BOX_LIST",
        "SEGMENT_SUBJECT",  # one approved subject, one node (statecore.subjects)
        "FINALIZE_RESULTS",
    ]
    assert 0 < await store.r.ttl(keys.job(job_id).meta) <= store.config.retention_s
    assert 0 < await store.r.ttl(keys.job(job_id).idem) <= store.config.retention_s


async def test_409s_and_400s_on_cluster(cluster_store, image):
    store = cluster_store
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    before = await footprint(store, job_id)
    cases = [
        (iv(st, keep(st, 0), base_version=st.version - 1), VersionConflict),
        (iv(st, keep(st, 0), pause_token="pause_nope"), PauseTokenMismatch),
        (iv(st, [{"box_id": "box_nope", "bbox": [1, 1, 2, 2]}]), InvalidRequest),
        (iv(st, [manual([0, 0, image.width + 1, 5])]), InvalidRequest),
    ]
    for req, err in cases:
        with pytest.raises(err) as ei:
            await store.intervene(job_id, req, "rev")
        if err is not InvalidRequest:
            assert ei.value.snapshot["version"] == st.version
    assert await footprint(store, job_id) == before

    await store.intervene(job_id, iv(st, keep(st, 1), iid="iv_x"), "rev")
    now = await store.get(job_id)
    with pytest.raises(IdempotencyConflict):
        await store.intervene(job_id, iv(st, keep(st, 1), iid="iv_x"), "other-reviewer")
    with pytest.raises(PauseNotActive) as ei:
        await store.intervene(job_id, iv(st, keep(st, 1), base_version=now.version), "rev")
    assert ei.value.snapshot["status"] == "PROCESSING_APPROVED_SUBJECTS"


async def test_cancel_and_reports_on_cluster(cluster_store, image):
    store = cluster_store
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    detect_nid = st.current_node.node_instance_id
    snap = await store.cancel(job_id, "admin")
    assert snap.status == S.CANCELLED and snap.active_pause is None
    assert await store.cancel(job_id, "admin") == snap
    assert [h.status for h in await store.pause_history(job_id)] == ["CANCELLED"]
    with pytest.raises(JobCancelled):
        await store.intervene(job_id, iv(st, keep(st, 0)), "rev")
    late = NodeReport(node_instance_id="node_late", node_type="DETECT_SUBJECTS", job_id=job_id, outcome="FAILED")
    assert await store.apply_report(late) == "IGNORED"
    assert await store.apply_report(late) == "DUPLICATE"
    assert await store.apply_report(late.model_copy(update={"node_instance_id": detect_nid})) == "DUPLICATE"
    after = await store.get(job_id)
    assert after.status == S.CANCELLED and after.version == snap.version
    assert [e.type for e in await store.events_after(job_id)][-1] == "REPORT_IGNORED"

    empty = await waiting_job(store, image)
    st = await store.get(empty)
    await store.intervene(empty, iv(st, []), "rev")
    with pytest.raises(JobTerminal):
        await store.cancel(empty, "admin")
    assert 0 < await store.r.ttl(keys.job(empty).idem)


async def test_create_idempotency_on_cluster(cluster_store, image):
    store = cluster_store
    a = await store.create_job("alice", image, "batch/1.png")
    b = await store.create_job("alice", image, "batch/1.png")
    assert b.replayed and b.body == a.body and b.job_id == a.job_id
    other = image.model_copy(update={"sha256": "b" * 64})
    with pytest.raises(IdempotencyConflict) as ei:
        await store.create_job("alice", other, "batch/1.png")
    assert ei.value.job_id == a.job_id and ei.value.snapshot["job_id"] == a.job_id
    c = await store.create_job("bob", image, "batch/1.png")
    assert c.job_id != a.job_id
    # The creation record and the job share a hash slot (the script writes both).
    assert redis.cluster.key_slot(keys.create_idem("alice", "batch/1.png").encode()) == redis.cluster.key_slot(
        keys.job(a.job_id).meta.encode()
    )


async def test_jobs_spread_over_nodes_and_outbox_reads(cluster_store, image, redis_cluster):
    store = cluster_store
    job_ids = [await create(store, image) for _ in range(30)]
    holders: Counter[int] = Counter()
    for node in redis_cluster.nodes:
        c = redis.Redis(port=node.port, decode_responses=True)
        try:
            metas = [k for k in c.scan_iter(match="hitl:*:job:*:meta", count=1000)]
        finally:
            c.close()
        holders[node.port] = len(metas)
    assert sum(holders.values()) == 30
    assert sum(1 for n in holders.values() if n) >= 2, holders
    assert len({keys.job(j).p for j in job_ids}) > 10

    got = []
    for _ in range(5):
        got += await store.outbox_read("d1", count=100, block_ms=0)
        if len(got) >= 30:
            break
    assert sorted(e.command.job_id for e in got) == sorted(job_ids)
    assert {e.command.node_type for e in got} == {"DETECT_SUBJECTS"}
    assert await store.outbox_pending() == 30
    for e in got[:10]:
        await store.outbox_ack(e)
    assert await store.outbox_pending() == 20
    reclaimed = await store.outbox_reclaim("d2", min_idle_ms=0)
    assert sorted(e.entry_id for e in reclaimed) == sorted(e.entry_id for e in got[10:])
    # Reports through the reclaimed commands land on whichever node owns each job.
    for e in reclaimed:
        res = await store.apply_report(
            NodeReport(
                node_instance_id=e.command.node_instance_id,
                node_type=e.command.node_type,
                job_id=e.command.job_id,
                outcome="SUCCEEDED",
                output={"boxes": THREE_BOXES},
            )
        )
        assert res == "OK"
    jobs, _ = await store.list_jobs(status="WAITING_USER_SELECTION", limit=100)
    assert sorted(j.job_id for j in jobs) == sorted(e.command.job_id for e in reclaimed)
