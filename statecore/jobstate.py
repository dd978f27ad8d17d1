"""A job as the decider sees it: the fields of its meta hash, parsed (one HGETALL).

See docs/protocol.md § Redis layout for the hash and § Routes for the snapshot it answers with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import TypeAdapter

from . import gate_spot
from .errors import JobNotFound
from .ids import batch_of
from .keys import SUBJECT_NODE_FIELD, SUBJECT_RESULT_FIELD
from .models import (
    PENDING_ACTIONS_MASK_REVIEW,
    PENDING_ACTIONS_WAITING,
    Box,
    CurrentNode,
    ImageRef,
    JobSnapshot,
    JobSummary,
    Pause,
    QuorumView,
    QuorumVote,
    SubjectResult,
)
from .states import JobStatus


def needed_of(invited: int, policy: str) -> int:
    """Compatible submissions that decide a pause of ``invited`` reviewers under ``policy``
    (docs/protocol.md § Quorum): all of them, more than half (⌈(N+1)/2⌉), or the first."""
    if policy == "any":
        return 1
    return invited // 2 + 1 if policy == "majority" else invited


# Stored fields are validated straight from their JSON by pydantic-core (one pass, no dicts in
# between): the same models and checks as ``Box(**json.loads(raw))``, at a fraction of the cost
# on the hot path of every state change (a consume reads the whole meta first).
_BOXES: TypeAdapter[list[Box]] = TypeAdapter(list[Box])
_RESULTS: TypeAdapter[list[SubjectResult]] = TypeAdapter(list[SubjectResult])


@dataclass
class JobState:
    """A job as read from its meta hash (one HGETALL)."""

    job_id: str
    submitter: str
    status: JobStatus
    version: int
    round: int
    created_at: str
    updated_at: str
    image: ImageRef
    box_list: list[Box]
    approved_box_list: list[Box]
    active_pause: Pause | None
    current_node: CurrentNode | None
    reason_code: str | None
    cancel_requested: bool
    empty_selection: bool
    results: list[SubjectResult]
    idem_key: str | None
    policy: dict[str, Any]
    node_input: dict[str, Any] | None = None  # the queued or running node's input, for a re-dispatch
    # A mask review's REFINE points per subject, while their SEGMENT_SUBJECT nodes run (statecore.subjects).
    refine_prompts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    votes: str = ""  # the active pause's quorum votes as stored (statecore.quorum), compared by the script
    # The version the archive's live mirror holds (--durability strict's journal: archive/journal.py); -1: none.
    mirrored: int = -1
    # The live SEGMENT_SUBJECT nodes by node id, one per subject being cut (statecore.subjects).
    subject_nodes: dict[str, CurrentNode] = field(default_factory=dict)
    # The auto-approve policy that approved the box list (``policy:<name>@<hash>``), and, on a job a
    # person reviews, what the policy thought (JSON; the control plane's alone: statecore.auto_plan).
    decided_by: str | None = None
    auto_review: str = ""

    def live_node(self, nid: str) -> CurrentNode | None:
        """The node ``nid`` if it is one of the job's nodes: its current node (which stays current,
        ended, until the next one) or a live subject node."""
        node = self.current_node
        if node is not None and node.node_instance_id == nid:
            return node
        return self.subject_nodes.get(nid)

    @classmethod
    def from_meta(cls, meta: dict[str, str]) -> JobState:
        get = meta.get

        def j(name: str, default: Any = None) -> Any:
            raw = get(name)
            return orjson.loads(raw) if raw else default

        pause = get("active_pause")
        node = get("current_node")
        boxes = get("box_list")
        approved = get("approved_box_list")
        results = get("results")
        return cls(
            job_id=meta["job_id"],
            submitter=get("submitter", ""),
            status=JobStatus(meta["status"]),
            version=int(meta["version"]),
            round=int(get("round", 1)),
            created_at=meta["created_at"],
            updated_at=meta["updated_at"],
            image=ImageRef.model_validate_json(meta["image"]),
            box_list=_BOXES.validate_json(boxes) if boxes and boxes != "[]" else [],
            approved_box_list=_BOXES.validate_json(approved) if approved and approved != "[]" else [],
            active_pause=Pause.model_validate_json(pause) if pause else None,
            current_node=CurrentNode.model_validate_json(node) if node else None,
            reason_code=get("reason_code") or None,
            cancel_requested=get("cancel_requested") == "1",
            empty_selection=get("empty_selection") == "1",
            results=_results(meta, results),
            idem_key=get("idem_key") or None,
            policy=j("policy", {}),
            node_input=j("node_input"),
            refine_prompts=j("refine_prompts", {}),
            votes=get("votes", ""),
            mirrored=int(get("mirrored") or -1),
            decided_by=get("decided_by") or None,
            auto_review=get("auto_review", ""),
            subject_nodes={
                k[len(SUBJECT_NODE_FIELD) :]: CurrentNode.model_validate_json(v)
                for k, v in meta.items()
                if k.startswith(SUBJECT_NODE_FIELD)
            },
        )

    def snapshot(self) -> JobSnapshot:
        waiting = self.active_pause is not None and self.active_pause.status == "WAITING"
        return JobSnapshot(
            job_id=self.job_id,
            status=self.status,
            version=self.version,
            round=self.round,
            created_at=self.created_at,
            updated_at=self.updated_at,
            image=self.image,
            box_list=self.box_list,
            approved_box_list=self.approved_box_list,
            active_pause=self.active_pause,
            pending_actions=(
                []
                if not waiting
                else list(PENDING_ACTIONS_MASK_REVIEW)
                if self.active_pause is not None and self.active_pause.stage == "WAITING_MASK_REVIEW"
                else list(PENDING_ACTIONS_WAITING)
            ),
            current_node=self.current_node,
            subject_nodes=list(self.subject_nodes.values()),
            reason_code=self.reason_code,
            cancel_requested=self.cancel_requested,
            empty_selection=self.empty_selection,
            subjects=gate_spot.shown(self),
            quorum=self.quorum_view(),
            decided_by=self.decided_by,
        )

    def quorum_view(self) -> QuorumView | None:
        """The active pause's quorum (docs/protocol.md § Quorum); None for jobs without one."""
        invited = int(self.policy.get("review_quorum") or 1)
        if invited < 2:
            return None
        policy = self.policy.get("quorum_policy") or "all"
        p = self.active_pause
        needed = 1 if p is not None and p.reconciliation else needed_of(invited, policy)
        votes = orjson.loads(self.votes) if self.votes else {}
        return QuorumView(
            needed=needed,
            invited=invited,
            policy=policy,
            votes=[QuorumVote(reviewer=r, at=v["at"]) for r, v in sorted(votes.items())],
        )

    def summary(self) -> JobSummary:
        p = self.active_pause
        return JobSummary(
            job_id=self.job_id,
            status=self.status,
            version=self.version,
            created_at=self.created_at,
            updated_at=self.updated_at,
            submitter=self.submitter,
            box_count=len(self.box_list),
            stage=p.stage if p else None,
            pause_created_at=p.created_at if p else None,
            batch=batch_of(self.idem_key),
            review_quorum=int(self.policy.get("review_quorum") or 1),
            quorum_policy=self.policy.get("quorum_policy") or "all",
        )


def _results(meta: dict[str, str], raw: str | None) -> list[SubjectResult]:
    """``results``, each subject's own ``result:<box_id>`` field in place of its entry (keys.result_field)."""
    results = _RESULTS.validate_json(raw) if raw and raw != "[]" else []
    n = len(SUBJECT_RESULT_FIELD)
    own = {k[n:]: v for k, v in meta.items() if k.startswith(SUBJECT_RESULT_FIELD)}
    if not own:
        return results
    return [SubjectResult.model_validate_json(own[r.box_id]) if r.box_id in own else r for r in results]


def require(meta: dict[str, str], job_id: str) -> JobState:
    if not meta:
        raise JobNotFound(f"job {job_id} not found", job_id=job_id)
    return JobState.from_meta(meta)
