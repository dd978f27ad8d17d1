"""The load test's invariant checker against a real redis-server.

Jobs are driven through the store into every kind of state a run leaves behind; a clean set must
report zero breaches. Then one invariant at a time is broken on purpose with raw Redis writes (or a
doctored client record) and the checker must name exactly that invariant and that job.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from hitl_review.statecore import keys
from hitl_review.statecore.ids import new_id, now_iso
from hitl_review.statecore.models import NodeCommand, NodeReport
from loadtest.check_invariants import INVARIANTS, Report, check

from .helpers import create, iv, keep, manual, report, validate, waiting_job


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _record(path: Path, *rows: dict) -> Path:
    with path.open("a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def _iv_row(job_id: str, iid: str, token: str, body: str, replayed: bool = False, status: int = 200) -> dict:
    return {
        "kind": "intervention",
        "job_id": job_id,
        "intervention_id": iid,
        "pause_token": token,
        "status": status,
        "replayed": replayed,
        "body_sha256": _sha(body),
    }


async def _run(store, record: Path | None = None, now: float | None = None) -> Report:
    return await check(store, record=record, quiet_timeout=0, now=now)


async def _drain(store) -> None:
    """Play a dispatcher that took and acked every command (nothing left pending)."""
    streams = {s: ">" for s in keys.all_outboxes()}
    for stream, entries in await store.r.xreadgroup(keys.OUTBOX_GROUP, "test", streams, count=10_000) or []:
        for eid, _ in entries:
            await store.r.xack(stream, keys.OUTBOX_GROUP, eid)


async def _consumed(store, image, subjects_of=lambda st: keep(st, 0, 1), iid: str | None = None):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    reply = await store.intervene(job_id, iv(st, subjects_of(st), iid=iid), "rev1")
    return job_id, st, reply


async def _started(store, job_id: str) -> None:
    """Start the node the job waits on (cutting subjects: the first subject's)."""
    st = await store.get(job_id)
    node = next(iter(st.subject_nodes.values()), None) or st.current_node
    cmd = NodeCommand(
        node_instance_id=node.node_instance_id, node_type=node.node_type, job_id=job_id, enqueued_at=now_iso()
    )
    assert await store.node_started(cmd) == "OK"


async def _append_event(store, job_id: str, etype: str, status: str, version: int, at: str, data: dict) -> None:
    """A raw event, in whatever shape the job's event log has (list of JSON, or a stream)."""
    jk = keys.job(job_id)
    seq = await store.r.hincrby(jk.meta, "event_seq", 1)
    if await store.r.type(jk.events) == "stream":
        await store.r.xadd(
            jk.events, {"t": etype, "s": status, "v": version, "at": at, "d": json.dumps(data)}, id=f"{seq}-0"
        )
    else:
        await store.r.rpush(
            jk.events,
            json.dumps({"id": seq, "type": etype, "version": version, "status": status, "at": at, "data": data}),
        )


async def _only(
    store, invariant: str, job_id: str, says: str | None = None, record: Path | None = None, now: float | None = None
) -> Report:
    """Check: exactly ``invariant`` is breached, by ``job_id`` alone, and the details say ``says``."""
    rep = await _run(store, record, now)
    assert rep.breached() == {invariant: [job_id]}, rep.details()
    assert says is None or says in rep.details(), rep.details()
    return rep


async def _waiting_beside_another(store, image) -> str:
    """A waiting job to break, and an innocent one beside it that the checker must not name."""
    job_id = await waiting_job(store, image)
    await waiting_job(store, image)
    return job_id


async def test_clean_set_of_every_kind_of_job_has_no_breach(store, image, tmp_path):
    rec = tmp_path / "record.jsonl"
    await create(store, image)  # DETECTING, its command undelivered
    taken = await waiting_job(store, image)  # WAITING_USER_SELECTION, its claim taken over
    await store.claim(taken, "rev1")
    await store.claim(taken, "rev2", force=True)  # CLAIM_TAKEN_OVER at the job's version
    # Consumed to PROCESSING, replayed once (both answers recorded), then a stale rival's 409.
    job_id, st, first = await _consumed(store, image, iid="iv_keep")
    again = await store.intervene(job_id, iv(st, keep(st, 0, 1), iid="iv_keep"), "rev1")
    assert again.replayed and again.body == first.body
    token = st.active_pause.pause_token
    _record(
        rec,
        _iv_row(job_id, "iv_keep", token, first.body),
        _iv_row(job_id, "iv_keep", token, again.body, True),
        _iv_row(job_id, "iv_rival", token, "{}", status=409),
    )
    await _consumed(store, image, lambda st: keep(st, 0) + [manual([300, 300, 400, 400])])  # VALIDATING
    await _consumed(store, image, lambda st: [])  # EMPTY_SELECTION
    await store.cancel(await waiting_job(store, image), "rev1")  # cancelled while waiting
    await store.cancel(await create(store, image), "rev1")  # cancelled while detecting
    # Cancelled while segmenting; the segmenter's late report is recorded as ignored.
    seg, _, _ = await _consumed(store, image)
    await _started(store, seg)
    node = next(n for n in (await store.get(seg)).subject_nodes.values() if n.status == "RUNNING")
    await store.cancel(seg, "rev1")
    assert (
        await store.apply_report(
            NodeReport(
                node_instance_id=node.node_instance_id, node_type=node.node_type, job_id=seg, outcome="SUCCEEDED"
            )
        )
        == "IGNORED"
    )
    # Round 2: a manual box failed naming, the revision pause waits.
    j2, st2, _ = await _consumed(store, image, lambda st: keep(st, 0) + [manual([300, 300, 400, 400])])
    added = (await store.get(j2)).box_list[-1].box_id
    await _started(store, j2)
    assert await validate(store, j2, {added: False}) == "OK"
    assert (await store.get(j2)).active_pause.stage == "WAITING_BOX_BATCH_REVISION"
    # All the way to SUCCEEDED, as the dispatcher would play it.
    done, st3, _ = await _consumed(store, image)
    await _started(store, done)
    approved = (await store.get(done)).approved_box_list
    assert (
        await report(
            store,
            done,
            {
                "subjects": [
                    {"box_id": b.box_id, "status": "SUCCEEDED", "mask": "m.png", "cutout": "c.png"} for b in approved
                ]
            },
        )
        == "OK"
    )
    await _started(store, done)
    assert await report(store, done, {}) == "OK"
    assert (await store.get(done)).status == "SUCCEEDED"
    # A dispatcher took every command; it acknowledged (and the store may delete) only those it ran.
    for entry in await store.outbox_read("test", count=1000, block_ms=0):
        if entry.command.job_id == done:
            await store.outbox_ack(entry)

    rep = await _run(store, rec)
    assert rep.ok, rep.details()
    assert rep.info["jobs"] == 10
    assert rep.info["statuses"]["CANCELLED"] == 3
    for name in INVARIANTS:
        if name not in ("api_consistent", "create_idempotent"):
            assert rep.inv[name].checked > 0, name
    assert rep.to_json()["invariants"]["cancel_final"]["checked"] == 3


async def test_a_second_command_for_a_consumed_pause(store, image):
    job_id, _, _ = await _consumed(store, image)
    await _consumed(store, image)  # an innocent bystander
    cmd = (await store.outbox_commands(job_id))[-1]
    assert cmd.node_type == "SEGMENT_SUBJECT"  # the first approved subject's node (statecore.subjects)
    twin = cmd.model_copy(update={"node_instance_id": new_id("node")})
    await store.r.xadd(keys.command_outbox(job_id, twin.node_type), {"job": job_id, "cmd": twin.model_dump_json()})
    await _only(store, "consumption_next_step", job_id, says="SEGMENT_SUBJECT': 2")


async def test_a_consumed_pause_without_its_command(store, image):
    job_id, _, _ = await _consumed(store, image)
    stream = keys.command_outbox(job_id, "SEGMENT_SUBJECT")
    for eid, f in await store.r.xrange(stream):
        if f["job"] == job_id and "SEGMENT_SUBJECT" in f["cmd"]:
            await store.r.xdel(stream, eid)
    # Its DETECT command, still first in the stream, shows the stream was not trimmed.
    await _only(store, "consumption_next_step", job_id)


async def test_an_orphan_command(store, image):
    job_id = await waiting_job(store, image)
    stray = NodeCommand(
        node_instance_id=new_id("node"),
        node_type="PROCESS_APPROVED_BOX_LIST",
        job_id=job_id,
        enqueued_at="2001-01-01T00:00:00.000Z",
    )
    await store.r.xadd(keys.command_outbox(job_id, stray.node_type), {"job": job_id, "cmd": stray.model_dump_json()})
    await _only(store, "outbox_accounting", job_id)


async def test_a_cancelled_job_that_moved(store, image):
    job_id = await waiting_job(store, image)
    await store.cancel(job_id, "rev1")
    await store.cancel(await waiting_job(store, image), "rev1")  # cancelled and left alone
    v = int(await store.r.hget(keys.job(job_id).meta, "version"))
    await store.r.hset(keys.job(job_id).meta, mapping={"status": "PROCESSING_APPROVED_SUBJECTS", "version": v + 1})
    rep = await _only(store, "cancel_final", job_id)
    assert rep.inv["cancel_final"].checked == 2


async def test_a_replay_whose_body_differs(store, image, tmp_path):
    job_id, st, reply = await _consumed(store, image, iid="iv_dc")
    other, st_o, reply_o = await _consumed(store, image, iid="iv_ok")
    token = st.active_pause.pause_token
    rec = _record(
        tmp_path / "r.jsonl",
        _iv_row(job_id, "iv_dc", token, reply.body),
        _iv_row(job_id, "iv_dc", token, reply.body.replace('"accepted":true', '"accepted": true'), True),
        _iv_row(other, "iv_ok", st_o.active_pause.pause_token, reply_o.body),
        _iv_row(other, "iv_ok", st_o.active_pause.pause_token, reply_o.body, True),
    )
    await _only(store, "replay_identical", job_id, record=rec)


async def test_a_stored_response_that_differs_from_the_client_answer(store, image, tmp_path):
    job_id, st, reply = await _consumed(store, image, iid="iv_x")
    rec = _record(tmp_path / "r.jsonl", _iv_row(job_id, "iv_x", st.active_pause.pause_token, reply.body + " "))
    await _only(store, "replay_identical", job_id, record=rec)


async def test_two_fresh_winners_on_one_pause(store, image, tmp_path):
    job_id, st, reply = await _consumed(store, image, iid="iv_a")
    token = st.active_pause.pause_token
    rec = _record(
        tmp_path / "r.jsonl",
        _iv_row(job_id, "iv_a", token, reply.body),
        _iv_row(job_id, "iv_b", token, reply.body.replace("iv_a", "iv_b")),
    )
    rep = await _run(store, rec)
    assert set(rep.breached()) == {"pause_consumed_once", "client_success_committed"}
    assert rep.breached()["pause_consumed_once"] == [job_id]
    assert "iv_b answered 200" in rep.details()


async def test_a_pause_consumed_twice_in_the_log(store, image):
    job_id, st, _ = await _consumed(store, image, iid="iv_first")
    ia = next(e for e in await store.events_after(job_id) if e.type == "INTERVENTION_ACCEPTED")
    data = {k: v for k, v in ia.data.items() if k != "status"}
    await _append_event(
        store, job_id, ia.type, ia.data["status"], ia.version, ia.at, {**data, "intervention_id": "iv_second"}
    )
    await _consumed(store, image)
    await _only(store, "pause_consumed_once", job_id, says="consumed 2 times")


async def test_a_silently_stuck_job(store, image):
    job_id = await _waiting_beside_another(store, image)
    await _drain(store)
    await store.r.hdel(keys.job(job_id).meta, "active_pause", "pause_token", "current_node", "node_id")
    rep = await _only(store, "not_stuck", job_id)
    assert rep.info["quiet"] is True


async def test_a_queued_node_whose_command_is_gone(store, image):
    job_id, _, _ = await _consumed(store, image)
    await waiting_job(store, image)
    await _drain(store)  # delivered and acknowledged, but no report was ever applied
    await _only(store, "not_stuck", job_id, says="nothing will run it")


async def test_a_queued_node_is_only_a_warning_before_the_system_is_quiet(store, image):
    job_id, _, _ = await _consumed(store, image)
    await _drain(store)
    await create(store, image)  # something still pending elsewhere
    rep = await _run(store)
    assert rep.ok, rep.details()
    assert rep.info["quiet"] is False
    assert list(rep.inv["not_stuck"].warnings) == [job_id]


async def test_a_command_pending_beyond_the_grace_period(store, image):
    job_id = await create(store, image)
    assert (await _run(store)).ok  # just created: its DETECT command is pending, as it should be
    await _only(store, "not_stuck", job_id, says="beyond the 30s grace period", now=time.time() + 100)


async def test_versions_that_go_backwards(store, image):
    job_id = await _waiting_beside_another(store, image)
    await _append_event(store, job_id, "NODE_STARTED", "WAITING_USER_SELECTION", 1, now_iso(), {})
    await _only(store, "version_monotonic", job_id, says="after version 2")


async def test_an_illegal_status_change(store, image):
    job_id = await _waiting_beside_another(store, image)
    jk = keys.job(job_id)
    v = await store.r.hincrby(jk.meta, "version", 1)
    await _append_event(
        store,
        job_id,
        "STATUS_CHANGED",
        "DETECTING",
        v,
        now_iso(),
        {"from": "WAITING_USER_SELECTION", "to": "DETECTING"},
    )
    await store.r.hset(jk.meta, "status", "DETECTING")
    rep = await _run(store)
    assert rep.breached().get("status_chain") == [job_id], rep.details()
    assert "illegal transition WAITING_USER_SELECTION -> DETECTING" in rep.details()


async def test_idempotent_creation_seen_by_clients(store, image, tmp_path):
    first = await store.create_job("local", image, "key-1")
    again = await store.create_job("local", image, "key-1")
    assert again.replayed and again.job_id == first.job_id
    other = await create(store, image)
    row = {"kind": "create", "idempotency_key": "key-1", "status": 202}
    rec = _record(
        tmp_path / "r.jsonl",
        {**row, "job_id": first.job_id, "replayed": False, "body_sha256": _sha(first.body)},
        {**row, "job_id": first.job_id, "replayed": True, "body_sha256": _sha(again.body)},
        {**row, "idempotency_key": "key-2", "job_id": other, "replayed": False, "body_sha256": "a"},
        {**row, "idempotency_key": "key-2", "job_id": "job_elsewhere", "replayed": True, "body_sha256": "a"},
    )
    rep = await _run(store, rec)
    assert rep.breached() == {"create_idempotent": [other]}, rep.details()
    assert "gave jobs" in rep.details()
