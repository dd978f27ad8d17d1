"""Small drivers shared by the state-core tests: play the executor's part through the store."""

from __future__ import annotations

import uuid

from harness.executor import report
from hitl_review.statecore.models import ImageRef, InterventionRequest, NodeReport
from hitl_review.statecore.store import Store

THREE_BOXES = [
    {"bbox": [10, 10, 100, 120], "label": "shoe", "score": 0.93},
    {"bbox": [200, 40, 320, 200], "label": "shoe", "score": 0.88},
    {"bbox": [400, 100, 460, 300], "label": "hand", "score": 0.41},
]


async def create(store: Store, image: ImageRef, submitter: str = "alice", key: str | None = None) -> str:
    reply = await store.create_job(submitter, image, key)
    return reply.job_id


async def waiting_job(store: Store, image: ImageRef, boxes=THREE_BOXES, submitter: str = "alice") -> str:
    job_id = await create(store, image, submitter)
    assert await report(store, job_id, {"boxes": boxes}) == "OK"
    return job_id


async def detection_done(store: Store, job_id: str) -> NodeReport:
    """The report a detector would send for the job's current node: THREE_BOXES, succeeded."""
    node = (await store.get(job_id)).current_node
    assert node is not None
    return NodeReport(
        node_instance_id=node.node_instance_id,
        node_type=node.node_type,
        job_id=job_id,
        outcome="SUCCEEDED",
        output={"boxes": THREE_BOXES},
    )


def iv(state, subjects, iid: str | None = None, **over) -> InterventionRequest:
    p = state.active_pause
    body = {
        "intervention_id": iid or f"iv_{uuid.uuid4().hex[:12]}",
        "pause_token": p.pause_token if p else "pause_none",
        "base_version": state.version,
        "subjects": subjects,
    }
    body.update(over)
    return InterventionRequest(**body)


def keep(state, *idx):
    return [{"box_id": state.box_list[i].box_id, "bbox": list(state.box_list[i].bbox)} for i in idx]


async def footprint(store: Store, job_id: str) -> dict:
    """Everything a write could touch for one job: compare before/after to prove 'nothing written'.

    The audit log is not the job's state: a refused action is recorded there on purpose
    (docs/protocol.md § Audit), so its head fields are left out of the meta; :func:`audit_tail`
    shows what was recorded."""
    from hitl_review.statecore import keys

    jk = keys.job(job_id)
    meta = await store.r.hgetall(jk.meta)
    return {
        "meta": {k: v for k, v in meta.items() if k not in ("audit_head", "audit_seq")},
        "pauses": await store.r.hgetall(jk.pauses),
        "events": await store.r.lrange(jk.events, 0, -1),
        "idem": await store.r.hgetall(jk.idem),
        "reports": await store.r.smembers(jk.reports),
        "outbox_len": sum([await store.r.xlen(s) for s in jk.outboxes]),
        "outbox_cmds": [c.node_instance_id for c in await store.outbox_commands(job_id)],
        "waiting": await store.r.zscore(jk.waiting, job_id),
        "running": await store.r.zscore(jk.running, job_id),
    }


async def audit_tail(store: Store, job_id: str, n: int = 1) -> list[tuple[str, str, str]]:
    """The last ``n`` audit entries of the job as (actor, action, outcome)."""
    log = await store.audit(job_id)
    assert log is not None
    return [(e["actor"], e["action"], e["outcome"]) for e in log["entries"][-n:]]


def manual(bbox, label: str | None = "thing") -> dict:
    return {"bbox": list(bbox), "label": label}


async def validate(store: Store, job_id: str, passed: dict[str, bool]) -> str:
    """Play the validator: one verdict per box id (True = passed)."""
    return await report(
        store,
        job_id,
        {
            "results": [
                {"box_id": b, "passed": ok, "score": 0.9 if ok else 0.1, "reason": None if ok else "not an object"}
                for b, ok in passed.items()
            ]
        },
    )
