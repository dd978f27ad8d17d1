"""The audit log (docs/protocol.md § Audit) against a real Redis, a real archive (SQLite and
PostgreSQL) and the served API:

- every action of a job's life is in its chain, in order, with its actor and outcome (refused
  interventions with their 409 code, claims, cancels, reports applied and ignored);
- actions racing on one job extend one chain: no two entries share a predecessor (no fork);
- an entry edited, removed, reordered or cut off the end, in Redis or in the archive, is named by
  the verifier; ``hitl admin verify-audit`` exits 1 and names it, 0 on intact chains.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, select, update

from harness.tokens import auth
from hitl_review.archive.archiver import copy_job
from hitl_review.archive.db import Archive
from hitl_review.archive.schema import AuditEntry
from hitl_review.serve_app import cli
from hitl_review.serve_app.routes.audit_routes import verify_job
from hitl_review.serve_app.work.archiving import archive_job
from hitl_review.statecore import archive_queue, audit, errors, keys
from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.store import Store

from .api_util import blank_with_product, intervene, keep_all, submit, wait_status
from .helpers import THREE_BOXES, iv, keep, report, waiting_job
from .test_archive import finished_job


def trail(log: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(e["actor"], e["action"], e["outcome"]) for e in log["entries"]]


async def test_every_action_of_a_job_is_in_its_audit_chain(store: Store, image: Any) -> None:
    job_id = (await store.create_job("alice", image)).job_id
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    st = await store.get(job_id)
    await store.claim(job_id, "rev1")
    await store.claim(job_id, "rev1")  # a renewal: not an action worth an entry
    with pytest.raises(errors.ClaimedByOther):
        await store.claim(job_id, "rev2")
    await store.claim(job_id, "rev2", force=True)
    with pytest.raises(errors.ClaimedByOther):
        await store.release_claim(job_id, "rev1")
    stale = iv(st, keep(st, 0), iid="iv_stale").model_copy(update={"base_version": st.version - 1})
    with pytest.raises(errors.VersionConflict):
        await store.intervene(job_id, stale, "rev1")
    ok = iv(st, keep(st, 0, 1), iid="iv_ok")
    assert (await store.intervene(job_id, ok, "rev2")).status_code == 200
    assert (await store.intervene(job_id, ok, "rev2")).replayed
    node = next(iter((await store.get(job_id)).subject_nodes.values()))  # one of its subjects' nodes
    await store.cancel(job_id, "rev1")
    await store.cancel(job_id, "rev1")
    nid = node.node_instance_id
    late = NodeReport(node_instance_id=nid, node_type=node.node_type, job_id=job_id, outcome="SUCCEEDED")
    assert await store.apply_report(late) == "IGNORED"

    log = await store.audit(job_id)
    assert log is not None
    assert trail(log) == [
        ("alice", "SUBMIT", "CREATED"),
        ("dispatcher", "NODE_REPORT", "APPLIED:WAITING_USER_SELECTION"),
        ("rev1", "CLAIM", "TAKEN"),
        ("rev2", "CLAIM", "REFUSED:CLAIMED_BY_OTHER"),
        ("rev2", "CLAIM", "TAKEN_OVER:rev1"),
        ("rev1", "RELEASE", "REFUSED:CLAIMED_BY_OTHER"),
        ("rev1", "INTERVENE", "REFUSED:VERSION_CONFLICT"),
        ("rev2", "INTERVENE", "ACCEPTED"),
        ("rev2", "INTERVENE", "REPLAYED"),
        ("rev1", "CANCEL", "CANCELLED"),
        ("rev1", "CANCEL", "ALREADY_CANCELLED"),
        ("dispatcher", "NODE_REPORT", "IGNORED:JOB_TERMINAL"),
    ]
    entries = log["entries"]
    pause = st.active_pause
    assert pause is not None
    refused, accepted = entries[6], entries[7]
    assert refused["base_version"] == st.version - 1 and accepted["base_version"] == st.version
    assert accepted["snapshot_id"] == pause.snapshot_id  # the pause the reviewer answered
    assert [e["seq"] for e in entries] == list(range(1, 13))
    assert entries[0]["prev_hash"] == ""
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(entries, entries[1:], strict=False))
    assert log["head"] == entries[-1]["hash"] and log["head_seq"] == 12
    assert audit.verify(entries, log["head"], log["head_seq"]) is None
    assert all(audit.entry_hash(e) == e["hash"] for e in entries)  # Lua and Python hash the same text


async def test_actions_racing_on_one_job_extend_one_chain(store: Store, image: Any) -> None:
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    n_before = (await store.audit(job_id) or {})["head_seq"]

    async def refused(i: int) -> None:
        bad = iv(st, keep(st, 0), iid=f"iv_{i}").model_copy(update={"base_version": st.version + 1 + i})
        with pytest.raises(errors.VersionConflict):
            await store.intervene(job_id, bad, f"rev{i % 4}")

    async def claims(i: int) -> None:
        try:
            await store.claim(job_id, f"rev{i % 4}", force=i % 3 == 0)
        except errors.ClaimedByOther:
            pass

    await asyncio.gather(*(refused(i) for i in range(30)), *(claims(i) for i in range(30)))
    log = await store.audit(job_id)
    assert log is not None
    entries = log["entries"]
    assert audit.verify(entries, log["head"], log["head_seq"]) is None
    prevs = [e["prev_hash"] for e in entries]
    assert len(set(prevs)) == len(prevs)  # no entry shares a predecessor: the chain never forked
    assert sum(e["action"] == "INTERVENE" for e in entries) == 30
    assert len(entries) - n_before >= 30 + 1  # 30 refusals, and at least the first claim


# --------------------------------------------------------------------------- tampering


def _edit(entry: dict[str, Any], **change: Any) -> str:
    e = {**entry, **change}
    return json.dumps([e[f] for f in audit.FIELDS])


async def _tamper_redis(store: Store, job_id: str, how: str) -> None:
    jk = keys.job(job_id)
    raw = await store.r.lrange(jk.audit, 0, -1)
    e = audit.parse_all(raw)  # each with its prev_hash (Redis keeps it only as the entry before's hash)
    if how == "edit":  # entry 3's outcome changed, its hash left
        await store.r.lset(jk.audit, 2, _edit(e[2], outcome="ACCEPTED"))
    elif how == "edit_rehashed":  # entry 3 changed and its own hash recomputed: entry 4 gives it away
        forged = {**e[2], "actor": "mallory"}
        await store.r.lset(jk.audit, 2, _edit(forged, hash=audit.entry_hash(forged)))
    elif how == "delete":  # entry 2 removed
        await store.r.lrem(jk.audit, 1, raw[1])
    elif how == "reorder":  # entries 2 and 3 swapped
        await store.r.lset(jk.audit, 1, raw[2])
        await store.r.lset(jk.audit, 2, raw[1])
    elif how == "truncate":  # the last entry removed
        await store.r.rpop(jk.audit)


REDIS_TAMPERING = {"edit": 3, "edit_rehashed": 4, "delete": 2, "reorder": 2, "truncate": 5}


@pytest.mark.parametrize("how", sorted(REDIS_TAMPERING))
async def test_tampering_in_redis_is_named(store: Store, image: Any, how: str) -> None:
    job_id = await waiting_job(store, image)
    await store.claim(job_id, "rev1")
    await store.release_claim(job_id, "rev1")
    await store.cancel(job_id, "rev1")  # SUBMIT, NODE_REPORT, CLAIM, RELEASE, CANCEL
    assert await verify_job(store, None, job_id) == (1, [])
    await _tamper_redis(store, job_id, how)
    copies, findings = await verify_job(store, None, job_id)
    assert copies == 1 and len(findings) == 1
    f = findings[0]
    print(f"\n[audit] {how}: {f.source} entry {f.position}: {f.reason}")
    assert (f.job_id, f.source, f.position) == (job_id, "redis", REDIS_TAMPERING[how])


def _tamper_archive(archive: Archive, job_id: str, how: str) -> None:
    with archive.transaction() as s:
        rows = AuditEntry.job_id == job_id
        if how == "edit":
            s.execute(update(AuditEntry).where(rows, AuditEntry.seq == 3).values(outcome="REFUSED:VERSION_CONFLICT"))
        elif how == "delete":
            s.execute(delete(AuditEntry).where(rows, AuditEntry.seq == 2))
        elif how == "reorder":  # seq 2 and 3 swapped (through a free number: (job_id, seq) is the key)
            s.execute(update(AuditEntry).where(rows, AuditEntry.seq == 2).values(seq=-1))
            s.execute(update(AuditEntry).where(rows, AuditEntry.seq == 3).values(seq=2))
            s.execute(update(AuditEntry).where(rows, AuditEntry.seq == -1).values(seq=3))
        elif how == "truncate":
            last = s.scalar(select(AuditEntry.seq).where(rows).order_by(AuditEntry.seq.desc()).limit(1))
            s.execute(delete(AuditEntry).where(rows, AuditEntry.seq == last))


ARCHIVE_TAMPERING = {"edit": 3, "delete": 2, "reorder": 2, "truncate": None}


@pytest.mark.parametrize("how", sorted(ARCHIVE_TAMPERING))
async def test_tampering_in_the_archive_is_named(store: Store, image: Any, archive: Archive, how: str) -> None:
    job_id = await finished_job(store, image)
    await copy_job(store, archive, job_id)
    n = (await store.audit(job_id) or {})["head_seq"]
    assert n >= 6 and await verify_job(store, archive, job_id) == (2, [])  # Redis's copy and the archive's
    await asyncio.to_thread(_tamper_archive, archive, job_id, how)
    copies, findings = await verify_job(store, archive, job_id)
    assert copies == 2 and len(findings) == 1  # Redis's copy still verifies
    f = findings[0]
    print(f"\n[audit] archive ({archive.dialect}) {how}: entry {f.position}: {f.reason}")
    assert (f.job_id, f.source, f.position) == (job_id, "archive", ARCHIVE_TAMPERING[how] or n)


async def test_a_live_chain_rewritten_end_to_end_disagrees_with_the_archive(
    store: Store, image: Any, tmp_path: Any
) -> None:
    """Someone who can write Redis recomputes every hash after the entry they change: Redis's copy
    verifies on its own; the copy the archive took earlier does not agree with it."""
    from hitl_review.archive import migrate

    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    migrate.upgrade(url)
    archive = Archive(url)
    try:
        job_id = await finished_job(store, image)
        await copy_job(store, archive, job_id)
        jk = keys.job(job_id)
        entries = audit.parse_all(await store.r.lrange(jk.audit, 0, -1))
        entries[2]["actor"] = "mallory"
        prev = entries[1]["hash"]
        for e in entries[2:]:
            e["prev_hash"] = prev
            e["hash"] = prev = audit.entry_hash(e)
        await store.r.delete(jk.audit)
        await store.r.rpush(jk.audit, *(_edit(e) for e in entries))
        await store.r.hset(jk.meta, "audit_head", prev)
        assert audit.verify(entries, prev, len(entries)) is None  # a consistent forgery on its own
        copies, findings = await verify_job(store, archive, job_id)
        assert copies == 2 and [(f.source, f.position) for f in findings] == [("redis", 3)]
    finally:
        archive.close()


# --------------------------------------------------------------------------- the route and the command


def test_audit_route_and_verify_audit_command(api_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with httpx.Client(base_url=api_server.url, timeout=30) as c:
        r = submit(c, blank_with_product(11))
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        snap = wait_status(c, job_id, {"WAITING_USER_SELECTION"})
        assert intervene(c, job_id, snap, keep_all(snap)).status_code == 200
        wait_status(c, job_id)
        body = c.get(f"/api/v1/jobs/{job_id}/audit", headers=auth("rev1")).json()
        assert set(body) == {"job_id", "entries", "head"} and body["head"] == body["entries"][-1]["hash"]
        actions = [(e["action"], e["outcome"]) for e in body["entries"]]
        assert actions[0] == ("SUBMIT", "CREATED") and ("INTERVENE", "ACCEPTED") in actions
        assert body["entries"][0]["actor"] == "sub1"
        assert c.get(f"/api/v1/jobs/{job_id}/audit", headers=auth("sub1")).status_code == 200  # its own job
        assert c.get(f"/api/v1/jobs/{job_id}/audit", headers=auth("sub2")).status_code == 404
        assert c.get("/api/v1/admin/audit/verify", params={"job_id": job_id}, headers=auth("rev1")).status_code == 403
        assert c.get("/api/v1/admin/audit/verify", headers=auth("admin")).status_code == 400

    conn = ["--api-url", api_server.url, "--token", "tok-admin"]
    capsys.readouterr()
    assert cli.main(["admin", "verify-audit", job_id, *conn]) == 0
    assert "every chain verifies" in capsys.readouterr().out
    # Someone with Redis access edits the accepted intervention's entry into another reviewer's.
    import redis as redis_sync

    direct = redis_sync.Redis.from_url(api_server.redis_url, decode_responses=True)
    jk = keys.job(job_id)
    raw = direct.lrange(jk.audit, 0, -1)
    at = next(i for i, x in enumerate(raw) if audit.parse(x)["outcome"] == "ACCEPTED")
    direct.lset(jk.audit, at, _edit(audit.parse(raw[at]), actor="rev2"))
    direct.close()
    assert cli.main(["admin", "verify-audit", job_id, *conn]) == 1
    out = capsys.readouterr().out
    assert f"BROKEN {job_id} [redis]: entry {at + 1} (seq {at + 1})" in out and "edited" in out
    assert cli.main(["admin", "verify-audit", "--all", "--json", *conn]) == 1
    found = json.loads(capsys.readouterr().out)
    assert job_id in {b["job_id"] for b in found["broken"]} and found["checked"] >= 1


async def _archiving_store(redis_server: Any, tmp_path: Any) -> tuple[Store, Archive]:
    """A store with archiving on, and an SQLite archive at head."""
    from hitl_review.archive import migrate
    from hitl_review.statecore.store import StoreConfig

    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    await asyncio.to_thread(migrate.upgrade, url)
    return Store.from_url(redis_server.url, StoreConfig(retention_s=3600, archive=True)), Archive(url)


async def test_a_finished_job_that_gains_an_entry_is_archived_again(
    tmp_path: Any, redis_server: Any, image: Any
) -> None:
    """After its copy, a finished job gains audit entries (a refused intervention, a late report):
    each queues the copy again, so the archive holds them before the Redis records expire."""
    store, archive = await _archiving_store(redis_server, tmp_path)
    try:
        job_id = await waiting_job(store, image)
        st = await store.get(job_id)
        await store.cancel(job_id, "rev1")

        def archive_commands() -> Any:
            return cmds

        cmds = await archive_queue.commands(store, job_id)
        assert len(archive_commands()) == 1  # the terminal write's, once (not again for its CANCEL entry)
        assert await archive_job(store, archive, job_id) == "OK"
        with pytest.raises(errors.JobCancelled):
            await store.intervene(job_id, iv(st, keep(st, 0), iid="iv_late"), "rev2")
        cmds = await archive_queue.commands(store, job_id)
        assert len(archive_commands()) == 2
        assert await archive_job(store, archive, job_id) == "OK"
        kept = await asyncio.to_thread(_archived_trail, archive, job_id)
        assert kept[-1] == ("rev2", "INTERVENE", "REFUSED:JOB_CANCELLED")
        assert await verify_job(store, archive, job_id) == (2, [])
    finally:
        archive.close()
        await store.close()


async def test_a_burst_of_refusals_on_a_finished_job_queues_one_copy(
    tmp_path: Any, redis_server: Any, image: Any
) -> None:
    """Replays and refusals on a finished job (a double-click, a stale tab retrying) each add an audit
    entry, but while a copy is queued they ride on it: one archive command, not one per refusal. A copy
    made before the last of them is STALE; the next copy holds them all. A queued copy that never
    came (a dead letter) blocks nothing: after a minute an entry queues a new one."""
    store, archive = await _archiving_store(redis_server, tmp_path)
    try:
        job_id = await waiting_job(store, image)
        jk = keys.job(job_id)
        st = await store.get(job_id)
        await store.cancel(job_id, "rev1")

        async def queued() -> int:
            return len(await archive_queue.commands(store, job_id))

        async def refuse(n: int) -> None:
            for i in range(n):
                with pytest.raises(errors.JobCancelled):
                    await store.intervene(job_id, iv(st, keep(st, 0), iid=f"iv_late_{n}_{i}"), "rev2")

        await refuse(4)
        assert await queued() == 1  # the terminal write's command carries the 4 refusals too
        assert await store.r.hget(jk.meta, "archive_queued") is not None
        seq = int(await store.r.hget(jk.meta, "audit_seq"))
        version, last = int(await store.r.hget(jk.meta, "version")), int(await store.r.hget(jk.meta, "event_seq"))
        assert await store.archive_ack(job_id, version, last, seq - 1) == "STALE"  # a copy from before the last
        assert await store.r.hget(jk.meta, "archive_queued") is not None  # ... still on its way
        assert await archive_job(store, archive, job_id) == "OK"
        assert await store.r.hget(jk.meta, "archive_queued") is None
        kept = await asyncio.to_thread(_archived_trail, archive, job_id)
        assert [k[2] for k in kept].count("REFUSED:JOB_CANCELLED") == 4

        await refuse(3)
        assert await queued() == 2  # one new command for the next three
        # That command was lost (dead-lettered, say) a minute ago: the next entry queues another.
        await store.r.hset(jk.meta, "archive_queued", int(time.time() * 1000) - 61_000)
        await refuse(1)
        assert await queued() == 3
        assert await archive_job(store, archive, job_id) == "OK"
        kept = await asyncio.to_thread(_archived_trail, archive, job_id)
        assert [k[2] for k in kept].count("REFUSED:JOB_CANCELLED") == 8
        assert await verify_job(store, archive, job_id) == (2, [])
    finally:
        archive.close()
        await store.close()


def _archived_trail(archive: Archive, job_id: str) -> list[tuple[str, str, str]]:
    from hitl_review.archive import reads

    log = reads.audit(archive, job_id)
    assert log is not None
    return trail(log)
