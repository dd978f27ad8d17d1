"""An audit that links intent (docs/protocol.md § Audit, SPEC §11, seeds 000 and 003): from
``GET /jobs/{id}/audit`` alone an auditor reconstructs who saw what (``snapshot_id``,
``base_version``), decided what (``intervention_id``, ``payload_hash`` of the body as the
idempotency record hashes it, ``role``, the trusted proxy's ``proxy_user``) and what ran (each
model step's ``node``), for a quorum job with a round 2 and a mask review, driven through the
FastAPI app on a real redis-server (the model's reports applied through the store). The chain
covers the new fields: an edited ``role`` or ``payload_hash`` is named by the verifier, in Redis
and in the archive's copy, which keeps them; an entry written before them still verifies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select, update

from harness.executor import report
from harness.tokens import auth
from hitl_review.archive import migrate
from hitl_review.archive.archiver import copy_job
from hitl_review.archive.db import Archive
from hitl_review.archive.schema import AuditEntry
from hitl_review.serve_app.routes.audit_routes import verify_job
from hitl_review.statecore import audit, keys
from hitl_review.statecore.ids import payload_hash
from hitl_review.statecore.models import InterventionRequest
from hitl_review.statecore.store import Store, StoreConfig

from .api_util import png
from .asgi_util import asgi_client
from .helpers import THREE_BOXES

API = "/api/v1"
PROXY = {"X-Forwarded-User": "carol"}  # the authenticating proxy's user (no token): a reviewer
FAIL = {"verdict": "FAIL", "reasons": ["cut off"], "scores": {"fill": 0.9}, "policy": "gate-v1", "severity": 0.4}
PASS = {"verdict": "PASS", "reasons": [], "scores": {"fill": 0.6}, "policy": "gate-v1"}


async def _job(c: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    r = await c.get(f"{API}/jobs/{job_id}", headers=auth("rev1"))
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _answer(
    c: httpx.AsyncClient, job_id: str, snap: dict[str, Any], iid: str, headers: dict[str, str], **part: Any
) -> tuple[httpx.Response, dict[str, Any]]:
    pause = snap["active_pause"]
    body = {
        "intervention_id": iid,
        "pause_token": pause["pause_token"],
        "base_version": snap["version"],
        "snapshot_id": pause["snapshot_id"],
        **part,
    }
    return await c.post(f"{API}/jobs/{job_id}/interventions", json=body, headers=headers), body


async def _drive(c: httpx.AsyncClient, store: Store) -> tuple[str, dict[str, Any]]:
    """A review_quorum=2 job through round 1, round 2 and a mask review, rev1 (token) and carol
    (through the proxy) answering each; a stale answer refused, one answer replayed. Returns the job
    and what the test knows the auditor must find: each pause shown, each body sent."""
    r = await c.post(
        f"{API}/jobs?review_quorum=2", files={"image": ("a.png", png(640, 480), "image/png")}, headers=auth("sub1")
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    sent: dict[str, Any] = {"shown": {}, "bodies": {}}

    def keep(snap: dict[str, Any], drop: set[str] = frozenset()) -> list[dict[str, Any]]:  # type: ignore[assignment]
        return [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"] if b["box_id"] not in drop]

    # Round 1: both keep the first two boxes and add two named boxes.
    s1 = await _job(c, job_id)
    sent["shown"]["round1"] = s1["active_pause"]["snapshot_id"]
    round1 = keep(s1)[:2] + [
        {"bbox": [300, 300, 400, 400], "label": "ok"},
        {"bbox": [500, 300, 600, 400], "label": "bad"},
    ]
    stale = {**s1, "version": s1["version"] - 1}
    refused, body = await _answer(c, job_id, stale, "iv_stale", PROXY, subjects=round1)
    assert refused.status_code == 409 and refused.json()["code"] == "VERSION_CONFLICT"
    sent["bodies"]["iv_stale"] = ("carol", body)
    for iid, headers, who in (("iv_r1_rev1", auth("rev1"), "rev1"), ("iv_r1_carol", PROXY, "carol")):
        ok, body = await _answer(c, job_id, s1, iid, headers, subjects=round1)
        assert ok.status_code == 200, ok.text
        sent["bodies"][iid] = (who, body)
    again, _ = await _answer(c, job_id, s1, "iv_r1_rev1", auth("rev1"), subjects=round1)
    assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
    # The validator passes one manual box and not the other: round 2.
    v = await _job(c, job_id)
    assert v["status"] == "VALIDATING_MANUAL_BOXES", v["status"]
    named = {b["label"]: b["box_id"] for b in v["box_list"]}
    good, bad = named["ok"], named["bad"]
    verdicts = [
        {"box_id": good, "passed": True, "score": 0.9, "reason": None},
        {"box_id": bad, "passed": False, "score": 0.1, "reason": "not an object"},
    ]
    assert await report(store, job_id, {"results": verdicts}) == "OK"
    s2 = await _job(c, job_id)
    assert s2["status"] == "WAITING_BOX_BATCH_REVISION", s2["status"]
    sent["shown"]["round2"] = s2["active_pause"]["snapshot_id"]
    for iid, headers, who in (("iv_r2_rev1", auth("rev1"), "rev1"), ("iv_r2_carol", PROXY, "carol")):
        ok, body = await _answer(c, job_id, s2, iid, headers, subjects=keep(s2, {bad}))
        assert ok.status_code == 200, ok.text
        sent["bodies"][iid] = (who, body)
    # The segmenter: one mask fails the gate, a mask review.
    s3 = await _job(c, job_id)
    assert s3["status"] == "PROCESSING_APPROVED_SUBJECTS", s3["status"]
    ids = [b["box_id"] for b in s3["approved_box_list"]]
    sent["approved"] = ids
    subjects = [
        {"box_id": b, "status": "SUCCEEDED", "mask": f"m{n}.png", "cutout": f"c{n}.png", "quality": FAIL if n else PASS}
        for n, b in enumerate(ids)
    ]
    assert await report(store, job_id, {"subjects": subjects, "backend": "classical"}) == "OK"
    s4 = await _job(c, job_id)
    assert s4["status"] == "WAITING_MASK_REVIEW", s4["status"]
    sent["shown"]["masks"] = s4["active_pause"]["snapshot_id"]
    decisions = [{"box_id": s["box_id"], "decision": "ACCEPT"} for s in s4["active_pause"]["subjects_to_review"]]
    for iid, headers, who in (("iv_m_rev1", auth("rev1"), "rev1"), ("iv_m_carol", PROXY, "carol")):
        ok, body = await _answer(c, job_id, s4, iid, headers, decisions=decisions)
        assert ok.status_code == 200, ok.text
        sent["bodies"][iid] = (who, body)
    assert await report(store, job_id, {}) == "OK"
    assert (await _job(c, job_id))["status"] == "SUCCEEDED"
    return job_id, sent


async def test_an_auditor_reconstructs_who_saw_decided_and_ran_from_the_audit_alone(
    store: Store, tmp_path: Path
) -> None:
    config = StoreConfig(retention_s=3600, node_timeout_s=60, quality_gate="review-failing")
    async with asgi_client(store.url, tmp_path, config, trusted_proxies=["127.0.0.1"]) as c:
        job_id, sent = await _drive(c, store)
        r = await c.get(f"{API}/jobs/{job_id}/audit", headers=auth("admin"))
        assert r.status_code == 200, r.text
        log = r.json()
        entries = log["entries"]
        assert audit.verify(entries, log["head"]) is None

        # Decided what: every intervention entry names its intervention, the body's hash as the
        # idempotency record keeps it (the auditor checks a body handed to them against it), the role,
        # and the proxy's user for carol's; what was shown (snapshot_id, base_version).
        intent = [e for e in entries if e["intervention_id"]]
        assert [(e["intervention_id"], e["action"], e["outcome"]) for e in intent] == [
            ("iv_stale", "INTERVENE", "REFUSED:VERSION_CONFLICT"),
            ("iv_r1_rev1", "QUORUM_VOTE", "ACCEPTED"),
            ("iv_r1_carol", "INTERVENE", "ACCEPTED"),
            ("iv_r1_rev1", "INTERVENE", "REPLAYED"),
            ("iv_r2_rev1", "QUORUM_VOTE", "ACCEPTED"),
            ("iv_r2_carol", "INTERVENE", "ACCEPTED"),
            ("iv_m_rev1", "QUORUM_VOTE", "ACCEPTED"),
            ("iv_m_carol", "INTERVENE", "ACCEPTED"),
        ]
        for e in intent:
            who, body = sent["bodies"][e["intervention_id"]]
            assert e["actor"] == who and e["role"] == "reviewer"
            assert e["proxy_user"] == ("carol" if who == "carol" else None)
            assert e["payload_hash"] == payload_hash(InterventionRequest(**body).hashed_body(), who)
            assert (e["base_version"], e["snapshot_id"]) == (body["base_version"], body["snapshot_id"])
        record = await store.r.hget(keys.job(job_id).idem, "iv_r2_carol")
        assert record.split("\n", 1)[0] == intent[5]["payload_hash"]  # the idempotency record's own hash
        # Who saw what: the accepted answers name the pause each stage showed.
        accepted = [e for e in intent if e["outcome"] == "ACCEPTED"]
        assert [e["snapshot_id"] for e in accepted] == [
            sent["shown"][s] for s in ("round1", "round1", "round2", "round2", "masks", "masks")
        ]
        # What ran: each model step names its node; after each deciding answer, the node it queued.
        ran = [e["node"].split(":")[0] for e in entries if e["action"] == "NODE_REPORT"]
        segmented = ["SEGMENT_SUBJECT"] * len(sent["approved"])
        assert ran == ["DETECT_SUBJECTS", "VALIDATE_MANUAL_BOX_LIST", *segmented, "FINALIZE_RESULTS"]
        assert all(e["node"] and e["role"] is None for e in entries if e["action"].startswith("NODE_"))
        nodes = {n["node"].split(":")[1]: n["outcome"] for n in entries if n["node"]}
        for iid, runs in (("iv_r1_carol", "VALIDATE_MANUAL_BOX_LIST"), ("iv_m_carol", "FINALIZE_RESULTS")):
            at = next(i for i, e in enumerate(entries) if e["intervention_id"] == iid and e["outcome"] == "ACCEPTED")
            step = next(e for e in entries[at:] if e["action"].startswith("NODE_"))
            assert step["node"].startswith(runs + ":") and step["node"].split(":")[1] in nodes
        assert entries[0]["actor"] == "sub1" and entries[0]["role"] is None  # a submission: no intent fields

        # The archive keeps the new fields: the same body from its copy.
        url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
        migrate.upgrade(url)
        archive = Archive(url)
        try:
            await copy_job(store, archive, job_id)
            from hitl_review.archive import reads

            assert reads.audit(archive, job_id) == await store.audit(job_id)
            assert await verify_job(store, archive, job_id) == (2, [])
            # An edited role in Redis, an edited payload hash in the archive: each named.
            jk = keys.job(job_id)
            raw = await store.r.lrange(jk.audit, 0, -1)
            at = next(i for i, x in enumerate(raw) if audit.parse(x)["intervention_id"] == "iv_r2_carol")
            forged = {**audit.parse_all(raw)[at], "role": "admin"}
            await store.r.lset(jk.audit, at, json.dumps([forged[f] for f in audit.FIELDS]))
            with archive.transaction() as s:
                s.execute(
                    update(AuditEntry)
                    .where(AuditEntry.job_id == job_id, AuditEntry.seq == at + 1)
                    .values(intent={**(audit.intent_of(intent[5]) or {}), "payload_hash": "0" * 64})
                )
            copies, found = await verify_job(store, archive, job_id)
            assert copies == 2
            assert {(f.source, f.position) for f in found} == {("redis", at + 1), ("archive", at + 1)}
            assert all("role" in f.reason or "payload_hash" in f.reason for f in found), found
            assert all("differs from the other copy in role, payload_hash" in f.reason for f in found), found
            # The admin route (hitl admin verify-audit) names it too; this app keeps no archive.
            v = await c.get(f"{API}/admin/audit/verify", params={"job_id": job_id}, headers=auth("admin"))
            assert [(b["source"], b["position"]) for b in v.json()["broken"]] == [("redis", at + 1)]
            with archive.reading() as s:
                assert s.scalars(select(AuditEntry.intent).where(AuditEntry.seq == 1)).first() is None
        finally:
            archive.close()


async def test_an_entry_written_before_the_intent_fields_still_verifies(store: Store, image: Any) -> None:
    """A chain whose first entries have no intent (stored as before: six to eight fields) verifies
    beside entries that carry it; its hash is the eight fields' alone."""
    job_id = (await store.create_job("alice", image)).job_id
    assert await report(store, job_id, {"boxes": THREE_BOXES}) == "OK"
    await store.cancel(job_id, "ops", role="admin", reason="运营清理: 14 天无人审")
    log = await store.audit(job_id)
    assert log is not None
    first, node, cancel = log["entries"]
    assert first["role"] is None and audit.intent_of(first) is None
    legacy = {k: first[k] for k in audit.LEGACY}
    assert audit.entry_hash(legacy) == first["hash"]  # the eight fields' hash, as before
    assert node["node"].startswith("DETECT_SUBJECTS:")
    assert (cancel["role"], cancel["reason"], cancel["outcome"]) == ("admin", "运营清理: 14 天无人审", "CANCELLED")
    assert audit.verify(log["entries"], log["head"], log["head_seq"]) is None
