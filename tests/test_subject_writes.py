"""A job's subject nodes started and reported by racing executors against a real redis-server
(statecore.subject_writes, lua/subject_write.lua; docs/protocol.md § Cut-out quality): no write plans
again because a sibling wrote first, every write is one version and one audit entry, the job moves on
exactly once, and the snapshot's subjects are assembled from each subject's own fields."""

from __future__ import annotations

import pytest_asyncio

from benchmarks.subject_race import approved_job, race
from hitl_review.statecore import keys
from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.states import JobStatus as S
from hitl_review.statecore.store import Store, StoreConfig

from .redis_traffic import traffic


@pytest_asyncio.fixture
async def store(redis_server):
    s = Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=60, retry_backoff_s=0.0))
    await s.r.flushdb()
    await s.ensure_groups()
    yield s
    await s.close()


async def test_racing_subject_writers_never_retry_for_a_sibling_and_move_the_job_on_once(store: Store):
    got = await race(store, subjects=40, writers=16)
    job_id = got["job_id"]
    assert got["answers"] == {"started:OK": 40, "report:OK": 40}
    assert got["stale"] == 0 and store.stale_answers == 0, got  # no write planned again
    assert got["moves_to_finalizing"] == 1
    st = await store.get(job_id)
    assert st.status == S.FINALIZING_RESULTS and st.current_node.node_type == "FINALIZE_RESULTS"
    assert not st.subject_nodes
    assert [r.status for r in st.results] == ["SUCCEEDED"] * 40
    assert all(r.attempts == 1 and r.mask_url for r in st.results)
    # Each of the 80 writes is one version (events of one write share it; none skipped, none shared)
    # and one audit entry; the subjects' own fields are folded into `results` by the last one.
    events = await store.events_after(job_id)
    cut = [e for e in events if e.type in ("NODE_STARTED", "NODE_COMPLETED") and e.data.get("box_id")]
    assert len(cut) == 80 and len({e.version for e in cut}) == 80
    first = min(e.version for e in cut)
    assert sorted(e.version for e in cut) == list(range(first, first + 80)) == list(range(first, st.version + 1))
    audit = await store.r.lrange(keys.job(job_id).audit, 0, -1)
    assert sum('"SEGMENT_SUBJECT:' in a for a in audit) == 80  # the intent names the node
    meta = await store.r.hgetall(keys.job(job_id).meta)
    assert not [f for f in meta if f.startswith((keys.SUBJECT_RESULT_FIELD, keys.SUBJECT_NODE_FIELD))]


async def test_a_subject_start_and_report_are_two_round_trips_each(store: Store):
    """The read before a subject write (the node, the job's end, the subject's result, Redis's clock) is
    one script, not three round trips (HMGET, HGET, TIME: issue 37's round trips per transition); the
    write is the second. Not the last subject: its report takes the whole job's path."""
    await race(store, subjects=2, writers=1)  # the scripts loaded in Redis (a first EVALSHA is answered NOSCRIPT)
    job_id = await approved_job(store, 2)
    cmd = [c for c in await store.outbox_commands(job_id) if c.node_type == "SEGMENT_SUBJECT"][0]
    with traffic() as start:
        assert await store.node_started(cmd) == "OK"
    box_id = cmd.input["approved_box_list"][0]["box_id"]
    rep = NodeReport(
        node_instance_id=cmd.node_instance_id,
        node_type=cmd.node_type,
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"subjects": [{"box_id": box_id, "status": "SUCCEEDED", "mask": f"m_{box_id}.png"}]},
    )
    with traffic() as report:
        assert await store.apply_report(rep) == "OK"
    for seen in (start, report):
        assert seen.round_trips == 2, seen
        assert "TIME" not in seen.commands and "HGET" not in seen.commands, seen
    st = await store.get(job_id)
    done = [r for r in st.results if r.box_id == box_id]
    assert [r.status for r in done] == ["SUCCEEDED"] and done[0].mask_url
