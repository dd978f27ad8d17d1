"""Node reports, the event log and key retention against a real redis-server: a report applied once,
superseded and failed nodes, contiguous resumable event ids, and which keys expire once a job ends."""

from __future__ import annotations

from hitl_review.statecore import keys
from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.states import JobStatus as S

from .helpers import THREE_BOXES, create, footprint, iv, keep, report, waiting_job
from .revision_flow import to_revision

# --------------------------------------------------------------------------- reports


async def test_duplicate_report_applied_once(store, image):
    job_id = await create(store, image)
    st = await store.get(job_id)
    rep = NodeReport(
        node_instance_id=st.current_node.node_instance_id,
        node_type="DETECT_SUBJECTS",
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"boxes": THREE_BOXES},
    )
    assert await store.apply_report(rep) == "OK"
    after = await store.get(job_id)
    before = await footprint(store, job_id)
    assert await store.apply_report(rep) == "DUPLICATE"
    # Even a different body under the same node instance is a duplicate, not a second application.
    assert await store.apply_report(rep.model_copy(update={"output": {"boxes": []}})) == "DUPLICATE"
    assert await footprint(store, job_id) == before
    assert (await store.get(job_id)).active_pause == after.active_pause


async def test_report_for_superseded_node_is_ignored(store, image):
    other = await create(store, image)
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, 0)), "rev")
    live = await store.get(job_id)
    foreign = (await store.get(other)).current_node.node_instance_id
    n = len(await store.events_after(job_id))
    for nid in (foreign, "node_" + "0" * 20):
        res = await store.apply_report(
            NodeReport(node_instance_id=nid, node_type="PROCESS_APPROVED_BOX_LIST", job_id=job_id, outcome="FAILED")
        )
        assert res == "IGNORED"
    now = await store.get(job_id)
    assert now.status == live.status and now.version == live.version and now.current_node == live.current_node
    ignored = await store.events_after(job_id, n)
    assert [e.type for e in ignored] == ["REPORT_IGNORED", "REPORT_IGNORED"]
    assert {e.data["reason"] for e in ignored} == {"NODE_SUPERSEDED"}
    # The other job is untouched by a report addressed to this one.
    assert (await store.get(other)).status == S.DETECTING


async def test_failed_and_timed_out_reports_end_the_job(store, image):
    for outcome, status in (("FAILED", S.FAILED), ("TIMED_OUT", S.TIMED_OUT)):
        job_id = await create(store, image)
        assert await report(store, job_id, {}, outcome=outcome, error_code="BOOM") == "OK"
        st = await store.get(job_id)
        assert st.status == status and st.reason_code == "BOOM" and st.current_node.status == outcome
        assert await store.r.zscore(keys.job(job_id).running, job_id) is None


async def test_node_started_marks_running_once_and_never_starts_a_running_node_again(store, image):
    job_id = await create(store, image)
    cmd = (await store.outbox_commands(job_id))[0]
    assert await store.node_started(cmd) == "OK"
    st = await store.get(job_id)
    assert st.current_node.status == "RUNNING" and st.current_node.attempt == 1 and st.version == 2
    assert st.current_node.started_at and st.current_node.deadline_at > st.current_node.started_at
    # The same command again (a reclaim while its first holder still runs it): BUSY, nothing written.
    assert await store.node_started(cmd) == "BUSY"
    again = await store.get(job_id)
    assert again.current_node.attempt == 1 and again.version == 2
    # The final report of a started node is still applied (started is not recorded as a report).
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    assert (await store.get(job_id)).status == S.WAITING_USER_SELECTION


# --------------------------------------------------------------------------- events


async def test_event_ids_are_contiguous_and_resumable(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, 0, 1)), "rev")
    st2 = await store.get(job_id)
    await report(
        store,
        job_id,
        {
            "subjects": [
                {"box_id": b.box_id, "status": "SUCCEEDED", "mask": "m.png", "cutout": "c.png"}
                for b in st2.approved_box_list
            ]
        },
    )
    await report(store, job_id, {})
    events = await store.events_after(job_id)
    n = len(events)
    assert n >= 10
    assert [e.id for e in events] == list(range(1, n + 1))
    assert events[0].type == "JOB_CREATED" and events[-1].type == "JOB_FINISHED"
    assert [e.version for e in events] == sorted(e.version for e in events)
    assert events[-1].version == (await store.get(job_id)).version
    for k in range(n + 1):
        after = await store.events_after(job_id, k)
        assert [e.id for e in after] == list(range(k + 1, n + 1))
    assert await store.events_after(job_id, n + 5) == []
    types = [e.type for e in events]
    for t in ("STATUS_CHANGED", "PAUSE_OPENED", "INTERVENTION_ACCEPTED", "NODE_COMPLETED", "SUBJECT_SEGMENTED"):
        assert t in types
    opened = next(e for e in events if e.type == "PAUSE_OPENED")
    assert opened.data["active_pause"]["pause_token"] == st.active_pause.pause_token
    assert len(opened.data["box_list"]) == 3
    streamed = [e.id async for e in store.stream_events(job_id, after=3, poll_s=0.05)]
    assert streamed == list(range(4, n + 1))


# --------------------------------------------------------------------------- retention


async def _ttls(store, job_id):
    jk = keys.job(job_id)
    return {k: await store.r.ttl(getattr(jk, k)) for k in ("meta", "pauses", "events", "idem", "reports")}


async def test_retention_finished_keys_expire_live_keys_do_not(store, image):
    # Live: waiting job, with a consumed round-1 pause and a recorded intervention and report.
    live, *_ = await to_revision(store, image, keep_model=True)
    assert set((await _ttls(store, live)).values()) == {-1}

    # Finished through reports (SUCCEEDED), created with an Idempotency-Key.
    ok = (await store.create_job("alice", image, "key-1")).job_id
    await report(store, ok, {"boxes": THREE_BOXES})
    st = await store.get(ok)
    await store.intervene(ok, iv(st, keep(st, 0)), "rev")
    await report(store, ok, {"subjects": [{"box_id": st.box_list[0].box_id, "status": "SUCCEEDED"}]})
    await report(store, ok, {})
    # Finished by the reviewer (EMPTY_SELECTION: the first intervention is also the last write).
    empty = (await store.create_job("alice", image, "key-2")).job_id
    await report(store, empty, {"boxes": THREE_BOXES})
    st = await store.get(empty)
    await store.intervene(empty, iv(st, []), "rev")
    # Finished by a cancel, then a late report.
    cancelled = await waiting_job(store, image)
    await store.cancel(cancelled, "admin")
    await store.apply_report(
        NodeReport(node_instance_id="node_late", node_type="DETECT_SUBJECTS", job_id=cancelled, outcome="FAILED")
    )

    retention = store.config.retention_s
    for job_id, expect in (
        (ok, {"meta", "pauses", "events", "idem", "reports"}),
        (empty, {"meta", "pauses", "events", "idem", "reports"}),
        (cancelled, {"meta", "pauses", "events", "reports"}),
    ):
        ttls = await _ttls(store, job_id)
        assert {k for k, t in ttls.items() if t != -2} == expect, (job_id, ttls)
        for k in expect:
            assert 0 < ttls[k] <= retention, (job_id, k, ttls)
    for key in ("key-1", "key-2"):
        t = await store.r.ttl(keys.create_idem("alice", key))
        assert 0 < t <= retention
    # Indexes are shared per partition and never expire; finished jobs leave the work indexes.
    for job_id in (ok, empty, cancelled):
        jk = keys.job(job_id)
        assert await store.r.zscore(jk.waiting, job_id) is None
        assert await store.r.zscore(jk.running, job_id) is None
        assert await store.r.ttl(jk.jobs) == -1 and await store.r.ttl(jk.outbox) == -1
    assert set((await _ttls(store, live)).values()) == {-1}
