"""Putting back a live job that Redis lost, from its mirror in the archive (docs/protocol.md §
Reconcile). A mirror is the job's meta hash and pause history as Redis last held them.

What the job gets back, in one script that refuses a job Redis holds again:

- waiting on a person: a fresh pause at the same stage and round over the same boxes (a new token
  and snapshot id; the mirrored pause is recorded CANCELLED, so its token is refused); a quorum's
  votes recorded on the old pause stay (each voter was told VOTE_RECORDED, and the boxes are the same);
- in model work: its node (cutting its subjects: each subject's node) queued again as a new node
  instance with the same input (a late report of the old instance is ignored like any superseded one);
- a job that was already finished is the archive's, and is not restored here.

The job's intervention records (votes included) and its creation record come back with it, so a
retried intervention, vote or creation is answered byte for byte as before the loss.

Every restore starts with a ``JOB_RESTORED`` event naming the version it came back from and the last
event id the mirror knew (``from_event``).

Event ids survive a restore: the new event list starts after ``event_base`` (kept in the meta), the
mirror's ``event_seq`` plus :data:`EVENT_ID_GAP`, so an id is never given twice to two different
events. The gap covers the events the mirror never saw (recorded within its last period before the
loss, or while it lagged): a reader that asks for the events after an id at or below ``event_base``
(lost with Redis) gets the whole new list, starting with ``JOB_RESTORED``; after a later id, the
events after it, with no gap (docs/protocol.md § Events).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from . import keys, subject_nodes
from .gates import plan_reoffer
from .ids import now_iso
from .jobstate import JobState
from .plan import Plan, requeue
from .states import is_terminal

REASON = "STORE_RESTORED"
# How far past the mirror's last event id the restored job's ids start: more than one job can record
# between two mirror writes (a step writes a few events, a segmentation one per box: at most 500).
EVENT_ID_GAP = 1_000_000


def event_base(meta: dict[str, str]) -> int:
    """The id just before the restored job's first event (its ``JOB_RESTORED``)."""
    return int(meta.get("event_seq") or 0) + EVENT_ID_GAP


def plan_restore(state: JobState, now: str, now_ms: int, workflow: str, from_event: int = 0) -> Plan | None:
    """The write that brings ``state`` back to life, or None when there is nothing to restore;
    ``from_event``: the last event id the mirror knew."""
    if is_terminal(state.status):
        return None
    pause = state.active_pause
    if pause is not None and pause.status == "WAITING":
        plan = plan_reoffer(state, now, now_ms, workflow)
        kind, data = plan.events[0]
        plan.events[0] = (kind, {**data, "reason": REASON})
        plan.waiting = ("add", int(datetime.fromisoformat(pause.created_at).timestamp() * 1000))
        plan.meta.pop("votes", None)  # the re-offer drops a quorum's votes; a restore keeps them
    elif any(n.status in subject_nodes.LIVE for n in state.subject_nodes.values()):
        # Cutting its subjects: each subject's node queued again as a new instance.
        plan = Plan(expect_version=state.version, status=state.status)
        for sub in state.subject_nodes.values():
            if sub.status in subject_nodes.LIVE:
                subject_nodes.retry(plan, state, sub, reason=REASON, now=now, now_ms=now_ms, not_before_ms=None)
    else:
        node = state.current_node
        if node is None or state.node_input is None:
            return None  # nothing that can run again (the mirror predates the node's input)
        plan = Plan(expect_version=state.version, status=state.status)
        requeue(plan, state, node, reason=REASON, now=now, now_ms=now_ms)
        plan.heartbeats = ("del", 0)
    restored = {
        "from_version": state.version,
        "from_event": from_event,
        "status": state.status.value,
        "reason": REASON,
    }
    plan.events.insert(0, ("JOB_RESTORED", restored))
    return plan


async def restore(
    store: Any,
    meta: dict[str, str],
    pauses: dict[str, str],
    records: dict[str, Any] | None = None,
    actor: str = "reconcile",
) -> str:
    """Restore one job from its mirror: ``RESTORED``, ``PRESENT`` (Redis holds it), ``FINISHED``
    or ``NOTHING_TO_RUN`` (a mirror without anything to wait for or run). ``records``: the mirrored
    intervention and creation records (``archive.mirror.read_rows``). ``actor``: whom the restored
    job's first audit entry names."""
    state = JobState.from_meta(meta)
    now, now_ms = now_iso(), int(time.time() * 1000)
    plan = plan_restore(state, now, now_ms, store.config.workflow_version, int(meta.get("event_seq") or 0))
    if plan is None:
        return "FINISHED" if is_terminal(state.status) else "NOTHING_TO_RUN"
    created_ms = int(datetime.fromisoformat(state.created_at).timestamp() * 1000)
    jk = keys.job(state.job_id)
    res = await store._scripts["restore_job"](
        keys=store._keys(state, jk),
        args=store._args(state.job_id, now, actor)
        + [json.dumps(meta), json.dumps(pauses), plan.to_json(now, store.config.archive), created_ms]
        + [event_base(meta), json.dumps(records or {})],
    )
    return "RESTORED" if res[0] == "OK" else "PRESENT"
