"""One SEGMENT_SUBJECT node per approved subject, side by side (SPEC §13, statecore.subjects,
statecore.subject_nodes) against a real redis-server: every subject's node queued in the approving
write (all or none), each its own instance, attempts, deadline, heartbeat and report, all running at
once; a subject's failure (its model's, its attempts running out, a dead letter) fails that subject
alone while the others go on; the job ends PARTIAL_SUCCEEDED; late, replayed and post-cancel reports
change nothing; the indices hold one member per live subject node and none once the job ends."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from hitl_review.serve_app.work.inspector import Inspector
from hitl_review.statecore import keys
from hitl_review.statecore.errors import VersionConflict
from hitl_review.statecore.models import NodeCommand, NodeReport
from hitl_review.statecore.restore import restore
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import create, iv, keep, report, waiting_job


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


async def _cmds(store: Store, job_id: str) -> dict[str, NodeCommand]:
    """The job's live subject nodes' commands, by the box each cuts."""
    st = await store.get(job_id)
    live = {nid for nid, n in st.subject_nodes.items() if n.status in ("QUEUED", "RETRY_WAIT", "RUNNING")}
    out = {}
    for c in await store.outbox_commands(job_id):
        if c.node_instance_id in live:
            out[c.input["approved_box_list"][0]["box_id"]] = c
    return out


def _report(cmd: NodeCommand, output: dict, outcome: str = "SUCCEEDED", **kw) -> NodeReport:
    return NodeReport(
        node_instance_id=cmd.node_instance_id,
        node_type=cmd.node_type,
        job_id=cmd.job_id,
        outcome=outcome,
        output=output,
        **kw,
    )


async def _members(store: Store, job_id: str, index: str) -> set[str]:
    """The job's subject nodes' members of ``index``."""
    p = keys.partition_of(job_id)
    key = {"queued": keys.queued(p), "running": keys.running(p), "heartbeats": keys.heartbeats(p)}[index]
    return {m for m in await store.r.zrange(key, 0, -1) if keys.split_member(m)[0] == job_id and "|" in m}


async def _finalize(store: Store, job_id: str) -> None:
    st = await store.get(job_id)
    assert st.status == S.FINALIZING_RESULTS and st.current_node.node_type == "FINALIZE_RESULTS"
    rep = NodeReport(
        node_instance_id=st.current_node.node_instance_id,
        node_type="FINALIZE_RESULTS",
        job_id=job_id,
        outcome="SUCCEEDED",
        output={},
    )
    assert await store.apply_report(rep) == "OK"


async def test_approval_fans_out_one_node_per_subject_in_the_same_write(store, image) -> None:
    job_id, ids = await _approved(store, image)
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    # Written with the approval, in the same version: every subject QUEUED, one command each.
    assert [(r.box_id, r.status, r.attempts) for r in st.results] == [(b, "QUEUED", 0) for b in ids]
    accepted = [e for e in await store.events_after(job_id) if e.type == "INTERVENTION_ACCEPTED"][-1]
    assert accepted.version == st.version and accepted.data["next_node_type"] == "PROCESS_APPROVED_BOX_LIST"
    cmds = await _cmds(store, job_id)
    assert sorted(cmds) == sorted(ids)
    assert sorted(accepted.data["node_instance_ids"]) == sorted(c.node_instance_id for c in cmds.values())
    assert {n.box_id for n in st.subject_nodes.values()} == set(ids)
    assert all(n.status == "QUEUED" and n.node_type == "SEGMENT_SUBJECT" for n in st.subject_nodes.values())
    assert await _members(store, job_id, "queued") == {
        keys.node_member(job_id, c.node_instance_id) for c in cmds.values()
    }
    assert (await store.backlog())[0] == len(ids)
    snap = await store.snapshot(job_id)
    assert {n.box_id for n in snap.subject_nodes} == set(ids)


async def test_a_refused_approval_queues_no_subject_node(store, image) -> None:
    """All or none: a submission refused (a stale base version) writes no command at all."""
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    stale = iv(st, keep(st, 0, 1, 2), base_version=st.version - 1)
    with pytest.raises(VersionConflict):
        await store.intervene(job_id, stale, "rev")
    assert not [c for c in await store.outbox_commands(job_id) if c.node_type == "SEGMENT_SUBJECT"]
    after = await store.get(job_id)
    assert after.version == st.version and after.subject_nodes == {} and after.results == []


async def test_subject_nodes_run_at_once_and_answer_in_any_order(store, image) -> None:
    job_id, ids = await _approved(store, image)
    cmds = await _cmds(store, job_id)
    for box in ids:  # every node started before any answers: they run side by side
        assert await store.node_started(cmds[box]) == "OK"
    st = await store.get(job_id)
    assert [(r.status, r.attempts) for r in st.results] == [("SEGMENTING", 1)] * len(ids)
    assert all(n.status == "RUNNING" and n.deadline_at for n in st.subject_nodes.values())
    members = {keys.node_member(job_id, c.node_instance_id) for c in cmds.values()}
    assert await _members(store, job_id, "running") == members
    assert await _members(store, job_id, "heartbeats") == members
    assert await _members(store, job_id, "queued") == set()
    for box in ids:  # each node beats for itself
        assert await store.heartbeat(job_id, cmds[box].node_instance_id)
    assert await store.node_started(cmds[ids[0]]) == "BUSY"  # a redelivered command is not run twice
    for n, box in enumerate(reversed(ids)):  # answers arrive last first
        assert await store.apply_report(_report(cmds[box], {"subjects": [_cut(box, n)]})) == "OK"
        st = await store.get(job_id)
        done = ids[len(ids) - n - 1 :]
        assert {r.box_id for r in st.results if r.status == "SUCCEEDED"} == set(done)
        assert not await store.heartbeat(job_id, cmds[box].node_instance_id)  # ended: no longer beats
        if n < len(ids) - 1:
            assert st.status == S.PROCESSING_APPROVED_SUBJECTS and len(st.subject_nodes) == len(ids) - n - 1
    assert st.status == S.FINALIZING_RESULTS and st.subject_nodes == {}
    for index in ("queued", "running", "heartbeats"):
        assert await _members(store, job_id, index) == set()
    segmented = [e.data["box_id"] for e in await store.events_after(job_id) if e.type == "SUBJECT_SEGMENTED"]
    assert segmented == list(reversed(ids))
    assert [r.attempts for r in st.results] == [1] * len(ids)
    await _finalize(store, job_id)
    assert (await store.get(job_id)).status == S.SUCCEEDED


async def test_a_subject_its_model_fails_fails_alone_and_the_job_ends_partial(store, image) -> None:
    job_id, (a, b, c) = await _approved(store, image)
    cmds = await _cmds(store, job_id)
    for box in (a, b, c):
        assert await store.node_started(cmds[box]) == "OK"
    failed = _report(cmds[b], {}, outcome="FAILED", error_code="MODEL_ERROR", error_message="CUDA out of memory")
    assert await store.apply_report(failed) == "OK"
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS  # the job goes on
    by_id = {r.box_id: r for r in st.results}
    assert (by_id[b].status, by_id[b].reason) == ("FAILED", "MODEL_ERROR") and by_id[b].mask_url is None
    assert by_id[a].status == by_id[c].status == "SEGMENTING"
    assert await store.apply_report(_report(cmds[a], {"subjects": [_cut(a, 0)]})) == "OK"
    assert await store.apply_report(_report(cmds[c], {"subjects": [_cut(c, 2)]})) == "OK"
    await _finalize(store, job_id)
    done = await store.get(job_id)
    assert done.status == S.PARTIAL_SUCCEEDED and done.reason_code == "SOME_SUBJECTS_FAILED"
    assert [r.status for r in done.results] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    # The failed subject's late answer after all: ignored, nothing changes.
    late = _report(cmds[b], {"subjects": [_cut(b, 9)]})
    assert await store.apply_report(late) == "DUPLICATE"
    assert (await store.get(job_id)).version == done.version


async def test_a_lost_attempt_retries_that_subject_alone_and_exhausted_attempts_fail_it(store, image) -> None:
    job_id, (a, b) = await _approved(store, image, n=2)
    first = await _cmds(store, job_id)
    assert await store.node_started(first[a]) == "OK"  # a runs the whole time b fails
    nids = []
    for attempt in range(1, store.config.max_attempts + 1):
        cmd = (await _cmds(store, job_id))[b]
        assert cmd.attempt == attempt - 1
        assert await store.node_started(cmd) == "OK"
        nids.append(cmd.node_instance_id)
        assert await store.node_failed(job_id, cmd.node_instance_id, reason="EXECUTOR_LOST") == "OK"
        st = await store.get(job_id)
        node_a = st.subject_nodes[first[a].node_instance_id]
        assert node_a.status == "RUNNING" and node_a.attempt == 1  # the other subject is untouched
        assert await store.heartbeat(job_id, first[a].node_instance_id)
        assert not await store.heartbeat(job_id, cmd.node_instance_id)  # the lost one is superseded
    assert len(set(nids)) == store.config.max_attempts  # a new instance per attempt, the same subject
    st = await store.get(job_id)
    # Out of attempts: that subject FAILED, not the job; a still cuts.
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    by_id = {r.box_id: r for r in st.results}
    assert (by_id[b].status, by_id[b].reason, by_id[b].attempts) == ("FAILED", "EXECUTOR_LOST", 3)
    retries = [e for e in await store.events_after(job_id) if e.type == "NODE_RETRY_SCHEDULED"]
    assert len(retries) == store.config.max_attempts - 1 and {e.data["box_id"] for e in retries} == {b}
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
    assert await store.apply_report(_report(first[a], {"subjects": [_cut(a, 0)]})) == "OK"
    st = await store.get(job_id)
    assert st.status == S.FINALIZING_RESULTS
    assert [(r.status, r.reason) for r in st.results] == [("SUCCEEDED", None), ("FAILED", "EXECUTOR_LOST")]


async def test_a_dead_lettered_subject_fails_alone(store, image) -> None:
    job_id, (a, b) = await _approved(store, image, n=2)
    cmds = await _cmds(store, job_id)
    assert await store.node_dead_lettered(job_id, cmds[a].node_instance_id, reason="DELIVERY_LIMIT", actor="d") == "OK"
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    assert [(r.status, r.reason) for r in st.results] == [("FAILED", "DELIVERY_LIMIT"), ("QUEUED", None)]
    assert sorted(await _cmds(store, job_id)) == [b]
    assert await store.node_started(cmds[b]) == "OK"
    timed_out = _report(cmds[b], {}, outcome="TIMED_OUT", error_code="NODE_DEADLINE_EXCEEDED")
    assert await store.apply_report(timed_out) == "OK"
    st = await store.get(job_id)
    assert st.status == S.FINALIZING_RESULTS and [r.status for r in st.results] == ["FAILED", "FAILED"]
    await _finalize(store, job_id)
    done = await store.get(job_id)
    assert done.status == S.FAILED and done.reason_code == "ALL_SUBJECTS_FAILED"


async def test_replays_and_reports_after_cancel_change_nothing(store, image) -> None:
    job_id, (a, b, c) = await _approved(store, image)
    cmds = await _cmds(store, job_id)
    rep = _report(cmds[a], {"subjects": [_cut(a, 0)]})
    assert await store.apply_report(rep) == "OK"
    v = (await store.get(job_id)).version
    assert await store.apply_report(rep) == "DUPLICATE"  # a redelivery
    assert (await store.get(job_id)).version == v
    assert await store.node_started(cmds[b]) == "OK"  # b runs, c still queued
    await store.cancel(job_id, "alice")
    cancelled = await store.get(job_id)
    assert cancelled.status == S.CANCELLED
    # Their nodes say so, and leave every index: nothing to time out, re-dispatch or count as backlog.
    assert {n.box_id: n.status for n in cancelled.subject_nodes.values()} == {b: "CANCELLED", c: "CANCELLED"}
    for index in ("queued", "running", "heartbeats"):
        assert await _members(store, job_id, index) == set()
    assert not await store.heartbeat(job_id, cmds[b].node_instance_id)
    assert await store.node_status(job_id, cmds[b].node_instance_id) == "CANCELLED"
    for box in (b, c):  # the running one answers late; the queued one is started by a dispatcher after all
        assert await store.apply_report(_report(cmds[box], {"subjects": [_cut(box, 1)]})) == "IGNORED"
    assert await store.node_started(cmds[c]) != "OK"
    after = await store.get(job_id)
    assert after.version == cancelled.version and after.results == cancelled.results
    ignored = [e for e in await store.events_after(job_id) if e.type == "REPORT_IGNORED"]
    assert {e.data["reason"] for e in ignored} == {"JOB_TERMINAL"}


async def test_nothing_approved_finishes_with_nothing_to_segment(store, image) -> None:
    """Every kept box marked SKIP: no subject to cut; the stage's one node of no box lets the job end."""
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    skipped = [{**s, "target_policy": "SKIP"} for s in keep(st, 0, 1)]
    reply = await store.intervene(job_id, iv(st, skipped), "rev")
    assert reply.status_code == 200
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS and st.results == [] and st.approved_box_list == []
    assert st.subject_nodes == {}
    node = st.current_node
    assert node.node_type == "PROCESS_APPROVED_BOX_LIST"
    rep = NodeReport(
        node_instance_id=node.node_instance_id,
        node_type=node.node_type,
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"subjects": []},
    )
    assert await store.apply_report(rep) == "OK"
    await _finalize(store, job_id)
    done = await store.get(job_id)
    assert done.status == S.SUCCEEDED and done.reason_code == "NOTHING_TO_SEGMENT"


# --------------------------------------------------------------------------- the inspector and restore


async def _fast(redis_server, **cfg) -> tuple[Store, asyncio.Event]:
    """A store of its own settings on an emptied server, and the stop flag of its heartbeat task."""
    fast = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, **cfg))
    await fast.r.flushdb()
    await fast.ensure_groups()
    return fast, asyncio.Event()


async def _beat(store: Store, job_id: str, nid: str, stop: asyncio.Event, ends: bool = False) -> None:
    """Heartbeats every 50 ms until ``stop``; each must be taken, unless ``ends``: a node the inspector
    timed out refuses the next one (which may come before the test sets ``stop``), and that ends it."""
    while not stop.is_set():
        taken = await store.heartbeat(job_id, nid)
        if not taken and ends:
            return
        assert taken
        await asyncio.sleep(0.05)


async def test_the_inspector_redispatches_the_lapsed_subject_node_alone(redis_server, image) -> None:
    """Two subjects' nodes run; the process cutting one stops (no heartbeat): the inspector's verdict
    replaces that node with a new instance of the same subject, the other runs on untouched."""
    fast, stop = await _fast(redis_server, node_timeout_s=60, retry_backoff_s=0.05)
    try:
        job_id, (a, b) = await _approved(fast, image, n=2)
        cmds = await _cmds(fast, job_id)
        for box in (a, b):
            assert await fast.node_started(cmds[box]) == "OK"
        beating = asyncio.create_task(_beat(fast, job_id, cmds[a].node_instance_id, stop))
        inspector = Inspector(fast, owner="i1", heartbeat_lapse_s=0.3)
        await asyncio.sleep(0.5)  # b's executor is gone; a's beats
        counts = await inspector.sweep()
        assert counts["lost"] == 1, counts
        st = await fast.get(job_id)
        assert st.status == S.PROCESSING_APPROVED_SUBJECTS
        node_a = st.subject_nodes[cmds[a].node_instance_id]
        assert node_a.status == "RUNNING" and node_a.attempt == 1
        (retry,) = [n for n in st.subject_nodes.values() if n.box_id == b]
        assert retry.node_instance_id != cmds[b].node_instance_id and retry.status == "RETRY_WAIT"
        assert retry.attempt == 1
        failed = [e.data for e in await fast.events_after(job_id) if e.type == "NODE_FAILED"]
        assert [(f["box_id"], f["reason"], f["retryable"]) for f in failed] == [(b, "EXECUTOR_LOST", True)]
        assert (await inspector.sweep())["lost"] == 0  # a, still beating, is never a verdict's
        # The lost attempt's late answer is ignored; the new instance's counts.
        late = _report(cmds[b], {"subjects": [_cut(b, 8)]})
        assert await fast.apply_report(late) == "IGNORED"
        new = (await _cmds(fast, job_id))[b]
        assert new.attempt == 1 and await fast.node_started(new) == "OK"
        assert await fast.apply_report(_report(new, {"subjects": [_cut(b, 1)]})) == "OK"
        stop.set()
        await beating
        assert await fast.apply_report(_report(cmds[a], {"subjects": [_cut(a, 0)]})) == "OK"
        st = await fast.get(job_id)
        assert st.status == S.FINALIZING_RESULTS
        assert [(r.box_id, r.status, r.attempts) for r in st.results] == [(a, "SUCCEEDED", 1), (b, "SUCCEEDED", 2)]
    finally:
        stop.set()
        await fast.close()


async def test_a_subject_node_past_its_deadline_fails_that_subject_alone(redis_server, image) -> None:
    fast, stop = await _fast(redis_server, node_timeout_s=0.3)
    try:
        job_id, (a, b) = await _approved(fast, image, n=2)
        cmds = await _cmds(fast, job_id)
        assert await fast.node_started(cmds[a]) == "OK"  # b still waits in the queue: no deadline yet
        beating = asyncio.create_task(_beat(fast, job_id, cmds[a].node_instance_id, stop, ends=True))
        await asyncio.sleep(0.5)
        counts = await Inspector(fast, owner="i1", grace_s=0, heartbeat_lapse_s=5).sweep()
        stop.set()
        await beating
        assert counts["timed_out"] == 1, counts
        st = await fast.get(job_id)
        assert st.status == S.PROCESSING_APPROVED_SUBJECTS
        by_id = {r.box_id: r for r in st.results}
        assert (by_id[a].status, by_id[a].reason) == ("FAILED", "NODE_DEADLINE_EXCEEDED")
        assert by_id[b].status == "QUEUED" and [n.box_id for n in st.subject_nodes.values()] == [b]
    finally:
        stop.set()
        await fast.close()


async def test_a_job_lost_mid_cut_is_restored_with_a_new_node_per_live_subject(store, image) -> None:
    """Redis loses a job while its subjects are being cut; restored from its mirror, each subject still
    being cut gets a new node instance (queued again), the subject already cut keeps its result."""
    job_id, (a, b, c) = await _approved(store, image)
    cmds = await _cmds(store, job_id)
    assert await store.apply_report(_report(cmds[a], {"subjects": [_cut(a, 0)]})) == "OK"
    assert await store.node_started(cmds[b]) == "OK"
    jk = keys.job(job_id)
    mirror = (await store.r.hgetall(jk.meta), await store.r.hgetall(jk.pauses))
    await store.r.flushdb()  # Redis came back empty
    await store.ensure_groups()
    assert await restore(store, *mirror) == "RESTORED"
    st = await store.get(job_id)
    assert st.status == S.PROCESSING_APPROVED_SUBJECTS
    assert {r.box_id: r.status for r in st.results} == {a: "SUCCEEDED", b: "SEGMENTING", c: "QUEUED"}
    fresh = await _cmds(store, job_id)
    assert sorted(fresh) == sorted([b, c])
    assert not {cmds[b].node_instance_id, cmds[c].node_instance_id} & {x.node_instance_id for x in fresh.values()}
    assert await _members(store, job_id, "queued") == {
        keys.node_member(job_id, x.node_instance_id) for x in fresh.values()
    }
    retried = [e.data for e in await store.events_after(job_id) if e.type == "NODE_RETRY_SCHEDULED"]
    assert sorted(e["box_id"] for e in retried) == sorted([b, c]) and {e["reason"] for e in retried} == {
        "STORE_RESTORED"
    }
    for box in (b, c):
        assert await store.node_started(fresh[box]) == "OK"
        assert await store.apply_report(_report(fresh[box], {"subjects": [_cut(box, 3)]})) == "OK"
    assert (await store.get(job_id)).status == S.FINALIZING_RESULTS


async def _approved_grid(store: Store, image, n: int) -> tuple[str, dict[str, NodeCommand]]:
    """A job whose reviewer approved ``n`` detected boxes (a grid over the image): one command per subject."""
    boxes = [
        {"bbox": [10 + 62 * (i % 10), 10 + 115 * (i // 10), 60 + 62 * (i % 10), 110 + 115 * (i // 10)], "score": 0.9}
        for i in range(n)
    ]
    job_id = await create(store, image)
    assert await report(store, job_id, {"boxes": boxes}) == "OK"
    st = await store.get(job_id)
    await store.intervene(job_id, iv(st, keep(st, *range(n))), "rev")
    return job_id, await _cmds(store, job_id)


async def test_forty_subjects_starting_and_answering_at_once_all_land(store, image) -> None:
    """More subject nodes than the Segmenter's default slots (2 replicas x 8: a scaled-out Segmenter, or a
    queue draining) start and answer at the same moment: each write that finds the job changed under it
    plans again (node_writes' STALE retries, spread by random waits that grow), so every start and every
    answer is applied exactly once. With 20 retries and no waits, some gave up (StaleRead)."""
    n = 40
    job_id, cmds = await _approved_grid(store, image, n)
    assert len(cmds) == n
    started = await asyncio.gather(*(store.node_started(c) for c in cmds.values()))
    assert started == ["OK"] * n
    st = await store.get(job_id)
    assert {x.status for x in st.subject_nodes.values()} == {"RUNNING"} and st.version == 3 + n
    answers = [_report(c, {"subjects": [_cut(b, i)]}) for i, (b, c) in enumerate(cmds.items())]
    assert await asyncio.gather(*(store.apply_report(a) for a in answers)) == ["OK"] * n
    st = await store.get(job_id)
    assert st.status == S.FINALIZING_RESULTS and st.version == 3 + 2 * n
    assert [(r.status, r.attempts) for r in st.results] == [("SUCCEEDED", 1)] * n
    events = await store.events_after(job_id)
    assert sum(e.type == "NODE_STARTED" and e.data["node_type"] == "SEGMENT_SUBJECT" for e in events) == n
    assert sorted(e.data["box_id"] for e in events if e.type == "SUBJECT_SEGMENTED") == sorted(cmds)


async def test_a_cancel_racing_forty_subjects_answers_lands_once_and_later_answers_are_ignored(store, image) -> None:
    n = 40
    job_id, cmds = await _approved_grid(store, image, n)
    assert await asyncio.gather(*(store.node_started(c) for c in cmds.values())) == ["OK"] * n
    answers = [store.apply_report(_report(c, {"subjects": [_cut(b, i)]})) for i, (b, c) in enumerate(cmds.items())]
    out = await asyncio.gather(*answers[: n // 2], store.cancel(job_id, "lead"), *answers[n // 2 :])
    snap, got = out[n // 2], out[: n // 2] + out[n // 2 + 1 :]
    assert snap.status == S.CANCELLED
    assert set(got) <= {"OK", "IGNORED"}, got
    st = await store.get(job_id)
    assert st.status == S.CANCELLED
    # Each answer that landed before the cancel is the subject's result; none after it changed anything.
    assert sum(r.status == "SUCCEEDED" for r in st.results) == got.count("OK")
    ignored = [e for e in await store.events_after(job_id) if e.type == "REPORT_IGNORED"]
    assert len(ignored) == got.count("IGNORED") and {e.data["reason"] for e in ignored} <= {"JOB_TERMINAL"}
