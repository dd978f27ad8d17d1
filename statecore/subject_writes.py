"""A ``SEGMENT_SUBJECT`` node's start and report at a cost that does not grow with the job's subjects
(docs/protocol.md § Cut-out quality, SPEC §13). A mixin of :class:`statecore.store.Store`.

The subjects of one job are cut side by side, as many at once as the Segmenter has slots. Each write
reads only its own node's field, its subject's result and the job's state fields, plans what
``statecore.reports`` would (the same node, result and events), and commits it through
``subject_write.lua``, which touches only that subject's fields and compares the node's field, not
the job's version: a sibling writing first never makes it plan again. The last live subject's
report, and anything out of the ordinary (the node gone, replaced or timed out, the job finished, a
job stored before these fields), answers ``FULL``: the caller then takes ``apply_report.lua``'s path
over the whole job, which moves the job on exactly once (statecore.node_writes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import keys, subjects
from .audit import Intent
from .errors import NodeExecutionError
from .ids import canonical_json, now_iso
from .models import CurrentNode, NodeReport, SubjectResult
from .nodes import ProcessOutput, parse_output
from .plan import Plan, dump_node, ms_to_iso
from .states import JobStatus, NodeType

Events = list[tuple[str, dict[str, Any]]]


def plan_started(
    node: CurrentNode, result: SubjectResult, now: str, now_ms: int, max_execution_s: float
) -> tuple[CurrentNode, SubjectResult, Events, list[list[Any]]]:
    """What ``reports.plan_node_started`` does for a subject node: RUNNING, one more attempt, its
    deadline; its subject ``SEGMENTING`` (a reviewer's ``REFINING`` stays) with one more attempt."""
    deadline_ms = now_ms + int(max_execution_s * 1000)
    started = node.model_copy(
        update={
            "status": "RUNNING",
            "attempt": node.attempt + 1,
            "started_at": now,
            "deadline_at": ms_to_iso(deadline_ms),
        }
    )
    status = "SEGMENTING" if result.status == "QUEUED" else result.status
    fresh = result.model_copy(update={"status": status, "attempts": result.attempts + 1})
    data: dict[str, Any] = {
        "node_instance_id": node.node_instance_id,
        "node_type": node.node_type,
        "attempt": started.attempt,
        "box_id": node.box_id,
    }
    members = [["queued", "del", 0], ["running", "add", deadline_ms], ["heartbeats", "add", now_ms]]
    return started, fresh, [("NODE_STARTED", data)], members


def plan_reported(
    node: CurrentNode, result: SubjectResult, report: NodeReport, artifact_url: Callable[[str], str]
) -> tuple[SubjectResult, Events]:
    """What ``reports.plan_report`` does for a subject node while others still run: NODE_COMPLETED,
    and its subject's result (cut, or FAILED with its reason) with its announcements."""
    output: ProcessOutput | None = None
    if report.outcome == "SUCCEEDED":
        try:
            parsed = parse_output(node.node_type, report.output)
            assert isinstance(parsed, ProcessOutput)  # a SEGMENT_SUBJECT's output
            output = parsed
        except NodeExecutionError as e:
            report = report.model_copy(update={"outcome": "FAILED", "error_code": e.code, "error_message": e.message})
    ev: dict[str, Any] = {
        "node_instance_id": node.node_instance_id,
        "node_type": node.node_type.value,
        "outcome": report.outcome,
        "box_id": node.box_id,
    }
    plan = Plan(expect_version=0, status=JobStatus.PROCESSING_APPROVED_SUBJECTS)  # collects the events
    if output is None:
        ev.update(error_code=report.error_code, error_message=report.error_message)
        plan.events.append(("NODE_COMPLETED", ev))
        if report.outcome == "TIMED_OUT":
            plan.events.append(("NODE_TIMED_OUT", {**ev, "attempt": node.attempt, "deadline_at": node.deadline_at}))
        why = report.error_code or ("NODE_TIMED_OUT" if report.outcome == "TIMED_OUT" else "NODE_FAILED")
        fresh = result.model_copy(update={"status": "FAILED", "reason": why, "mask_url": None, "cutout_url": None})
        subjects.announce(plan, fresh, None)
        return fresh, plan.events
    plan.events.append(("NODE_COMPLETED", ev))
    s = next((x for x in output.subjects if x.box_id == result.box_id), None)
    fresh = (
        subjects.result_of(result, s, artifact_url)
        if s is not None
        else SubjectResult(
            box_id=result.box_id, bbox=result.bbox, label=result.label, status="FAILED", reason=subjects.NO_RESULT
        )
    )
    subjects.announce(plan, fresh, s)
    keep: dict[str, Any] = {"attempts": result.attempts}
    if result.status == "REFINING":  # a reviewer's REFINE: final, as they decided it
        keep["decided_by"] = result.decided_by
    return fresh.model_copy(update=keep), plan.events


class SubjectWritesMixin:
    config: Any
    _scripts: dict[str, Any]
    _keys: Any  # Store._keys
    _args: Any  # Store._args
    r: Any

    async def _subject_write(
        self,
        job_id: str,
        nid: str,
        node_type: str,
        *,
        report: NodeReport | None,
        max_execution_s: float | None,
        actor: str,
        action: str,
    ) -> str | None:
        """Start (``report`` None) or report the subject node ``nid`` on its own fields: the answer
        (``OK``, ``BUSY``), or None when the caller must take the whole job's path (not a live
        subject node, the last one's report, or anything out of the ordinary)."""
        jk = keys.job(job_id)
        # The node, the job's end, the subject's result and Redis's clock: one round trip (subject_read.lua).
        raw_node, terminal, raw_result, seconds, micros = await self._scripts["subject_read"](
            keys=[jk.meta], args=[keys.node_field(nid), keys.SUBJECT_RESULT_FIELD]
        )
        if not raw_node or terminal == "1":
            return None
        node = CurrentNode.model_validate_json(raw_node)
        if node.node_type != NodeType.SEGMENT_SUBJECT or not node.box_id:
            return None
        if not raw_result:
            return None  # a job stored before subjects had fields of their own
        result = SubjectResult.model_validate_json(raw_result)
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        now = now_iso(now_ms / 1000)
        if report is None:
            if node.status == "RUNNING":
                return "BUSY"
            if node.status not in ("QUEUED", "RETRY_WAIT"):
                return None
            max_s = max_execution_s or self.config.max_execution_s(node.node_type.value)
            started, fresh, events, members = plan_started(node, result, now, now_ms, max_s)
            after = dump_node(started)
        else:
            if node.status not in ("QUEUED", "RETRY_WAIT", "RUNNING"):
                return None
            fresh, events = plan_reported(node, result, report, lambda n: f"/api/v1/artifacts/{n}")
            after = ""
            members = [["queued", "del", 0], ["running", "del", 0], ["heartbeats", "del", 0]]
        res = await self._scripts["subject_write"](
            keys=jk.for_script(),
            args=self._args(job_id, now, actor, Intent(node=f"{node_type or node.node_type.value}:{nid}"))
            + [
                nid,
                raw_node,
                "0" if report is None else "1",
                after,
                node.box_id,
                canonical_json(fresh.model_dump(mode="json")),
                canonical_json([[t, canonical_json(d)] for t, d in events]),
                canonical_json(members),
                action,
            ],
        )
        return str(res[0]) if res[0] == "OK" else None
