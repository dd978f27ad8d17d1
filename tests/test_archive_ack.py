"""A finished job is archived before its retention starts (docs/protocol.md § Archive), against a
real Redis: with archiving on, the terminal write queues the job's copy in its partition's archive
stream (not the node commands' outbox) and the index of jobs waiting for their copy, and sets no
TTL; ``archive_ack`` starts the retention only for the version and event the archive holds; a job
that went further answers STALE. With archiving off, retention starts at once."""

from __future__ import annotations

from hitl_review.statecore import archive_queue, keys
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import waiting_job


def _store(redis_server, archive: bool) -> Store:
    return Store.from_url(redis_server.url, StoreConfig(retention_s=3600, archive=archive))


async def test_a_finished_job_waits_for_the_archive_before_its_records_expire(redis_server, image):
    store = _store(redis_server, archive=True)
    try:
        job_id = await waiting_job(store, image)
        snap = await store.cancel(job_id, "rev1")
        jk = keys.job(job_id)
        assert await store.r.ttl(jk.meta) == -1 and await store.r.ttl(jk.events) == -1
        assert await store.r.zscore(keys.expiring(jk.p), job_id) is None
        (cmd,) = await archive_queue.commands(store, job_id)
        assert cmd["job"] == job_id and cmd["version"] == str(snap.version)
        # the node commands' outbox holds the job's first command only: no node dispatcher sees a copy
        assert [c.node_type for c in await store.outbox_commands(job_id)] == ["DETECT_SUBJECTS"]
        assert await store.r.zscore(jk.archive_waiting, job_id) is not None
        last = int(await store.r.hget(jk.meta, "event_seq"))
        seq = int(await store.r.hget(jk.meta, "audit_seq"))
        log = await store.audit(job_id)
        assert log is not None and [e["action"] for e in log["entries"]] == ["SUBMIT", "NODE_REPORT", "CANCEL"]
        assert seq == 3
        # A copy that is behind (an older version, fewer events or audit entries) does not start the retention.
        assert await store.archive_ack(job_id, snap.version - 1, last, seq) == "STALE"
        assert await store.archive_ack(job_id, snap.version, last - 1, seq) == "STALE"
        assert await store.archive_ack(job_id, snap.version, last, seq - 1) == "STALE"
        assert await store.r.ttl(jk.meta) == -1
        assert await store.r.zscore(jk.archive_waiting, job_id) is not None  # still waiting for its copy
        assert await store.archive_ack(job_id, snap.version, last, seq) == "OK"
        assert await store.r.zscore(jk.archive_waiting, job_id) is None
        for k in (jk.meta, jk.pauses, jk.events, jk.audit):
            assert 3500 < await store.r.ttl(k) <= 3600, k
        assert await store.r.zscore(keys.expiring(jk.p), job_id) is not None
        assert await store.archive_ack(job_id, snap.version, last, seq) == "OK"  # a redelivery: harmless
        assert await store.archive_ack("job_missing", 1, 1) == "JOB_NOT_FOUND"
        live = await waiting_job(store, image)
        assert await store.archive_ack(live, None) == "NOT_FINISHED"
        assert await store.r.ttl(keys.job(live).meta) == -1
    finally:
        await store.close()


async def test_without_archiving_the_retention_starts_at_the_terminal_write(redis_server, image):
    store = _store(redis_server, archive=False)
    try:
        job_id = await waiting_job(store, image)
        await store.cancel(job_id, "rev1")
        jk = keys.job(job_id)
        assert 3500 < await store.r.ttl(jk.meta) <= 3600
        assert await archive_queue.commands(store, job_id) == []
        assert await store.r.zscore(jk.archive_waiting, job_id) is None
    finally:
        await store.close()
