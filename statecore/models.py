"""Domain models: the JSON shapes of docs/protocol.md (§ Pause, § Routes, § Intervention, § Events),
used as they are by HTTP, SSE and the client. Node inputs and outputs live in ``statecore.nodes``."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .states import JobStatus, NodeType

BBox = tuple[float, float, float, float]
PauseStage = Literal["WAITING_USER_SELECTION", "WAITING_BOX_BATCH_REVISION", "WAITING_MASK_REVIEW"]
# How a quorum job's invited reviewers decide a pause (docs/protocol.md § Quorum, statecore.quorum).
QuorumPolicy = Literal["all", "majority", "any"]
QUORUM_POLICIES: tuple[str, ...] = ("all", "majority", "any")
PENDING_ACTIONS_WAITING = ["SUBMIT_BOX_LIST", "DRAW_MANUAL_BOX"]
PENDING_ACTIONS_MASK_REVIEW = ["DECIDE_SUBJECT_MASKS"]


def check_bbox(bbox: tuple[float, ...] | list[float]) -> BBox:
    """Four finite numbers with x1 < x2 and y1 < y2, non-negative (image bounds are checked by the store)."""
    if len(bbox) != 4:
        raise ValueError("bbox must have four numbers [x1, y1, x2, y2]")
    x1, y1, x2, y2 = (float(v) for v in bbox)
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)):
        raise ValueError("bbox coordinates must be finite numbers")
    if x1 < 0 or y1 < 0:
        raise ValueError("bbox coordinates must not be negative")
    if not (x1 < x2 and y1 < y2):
        raise ValueError("bbox is degenerate: need x1 < x2 and y1 < y2")
    return (x1, y1, x2, y2)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Validation(BaseModel):
    """The validator's verdict on a manual box. A box sent without a label and named by the validator
    carries who named it (``label_source``, the backend) and how sure it was (``label_score``);
    both are null for a box the reviewer labelled (docs/protocol.md § Second round)."""

    status: Literal["PASSED", "NEEDS_REVISION", "REJECTED"]
    score: float | None = None
    reason: str | None = None
    label_source: str | None = None
    label_score: float | None = None


class DetectorEvidence(BaseModel):
    """What the detector saw around a box it proposed, beyond its score (docs/protocol.md § Routes; the
    box policy reads it: ``statecore.autoapprove.EVIDENCE_FEATURES``): ``shrink``, 1 − IoU of the box
    with its foreground less shadow-like pixels (0: tight around it; 1: no foreground found), and
    ``parts``, the separate pieces of that foreground (2 or more: subjects merged into one box)."""

    shrink: float = Field(ge=0.0, le=1.0)
    parts: int = Field(ge=0)


class Box(BaseModel):
    box_id: str
    bbox: BBox
    label: str | None = None
    score: float | None = None
    source: Literal["model", "manual"]
    target_policy: Literal["SEGMENT", "SKIP"] = "SEGMENT"
    validation: Validation | None = None
    # A model box's evidence, as its detector proposed it: left out of the JSON where the detector
    # said none (every byte of a waiting job counts), dropped when a reviewer moves the box.
    evidence: DetectorEvidence | None = Field(default=None, exclude_if=lambda v: v is None)


class ConsumedBy(BaseModel):
    intervention_id: str
    reviewer: str


class QualityVerdict(BaseModel):
    """The quality gate's word on one mask (docs/protocol.md § Cut-out quality): under ``policy`` (its
    version, recorded with every verdict), ``PASS``, or ``FAIL`` with ``reasons`` a reviewer can read."""

    verdict: Literal["PASS", "FAIL"]
    reasons: list[str] = Field(default_factory=list)
    scores: dict[str, float] = Field(default_factory=dict)
    policy: str
    severity: float = 0.0  # how far past the policy's thresholds the mask is (0 for a pass)


class Refinement(BaseModel):
    """One refinement tried on a mask the gate failed: the prompt strategy and the gate's verdict on it."""

    strategy: str
    quality: QualityVerdict


class SubjectToReview(BaseModel):
    """One subject of a mask review: what the reviewer is shown and decides on."""

    box_id: str
    label: str | None = None
    bbox: BBox
    mask_url: str | None = None
    cutout_url: str | None = None
    quality: QualityVerdict | None = None
    reason: str | None = None  # why it waits for a person when no verdict says so (the gate gave none)


# The workflow definition of every pause recorded before pauses named theirs (docs/protocol.md § Pause).
FIRST_WORKFLOW_VERSION = "cutout-v1"


class Pause(BaseModel):
    pause_token: str
    status: Literal["WAITING", "CONSUMED", "CANCELLED"]
    stage: PauseStage
    base_version: int
    round: int
    snapshot_id: str
    box_ids_to_revise: list[str] = Field(default_factory=list)
    created_at: str
    consumed_at: str | None = None
    consumed_by: ConsumedBy | None = None
    workflow_version: str = FIRST_WORKFLOW_VERSION  # the definition that opened it (the fifth gate)
    # A reconciliation pause (docs/protocol.md § Quorum): each reviewer's list, side by side; one decides.
    reconciliation: dict[str, list[dict[str, Any]]] | None = None
    # A mask review (stage WAITING_MASK_REVIEW, docs/protocol.md § Cut-out quality): the subjects
    # that wait for a person's decision, each with its mask, cut-out and the gate's verdict.
    subjects_to_review: list[SubjectToReview] | None = None


class ImageRef(BaseModel):
    sha256: str
    width: int
    height: int
    url: str


class CurrentNode(BaseModel):
    """The job's node (docs/protocol.md § Executors and the outbox): QUEUED in the outbox,
    RETRY_WAIT until a re-dispatch's backoff passes, RUNNING under a heartbeat, then how it
    ended. ``attempt`` counts starts; ``deadline_at`` runs from ``started_at``. A ``SEGMENT_SUBJECT``
    node names the subject it cuts (``box_id``): a job runs one per subject at once (statecore.subjects)."""

    node_instance_id: str
    node_type: NodeType
    status: Literal["QUEUED", "RETRY_WAIT", "RUNNING", "COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED", "LOST"]
    attempt: int = 0
    box_id: str | None = None
    queued_at: str | None = None
    started_at: str | None = None
    heartbeat_at: str | None = None
    deadline_at: str | None = None


class JobFlag(BaseModel):
    """A reviewer's flag for a lead on a waiting job, and why (docs/protocol.md § Flags, skips and comments)."""

    by: str
    reason: str
    at: str


class JobComment(BaseModel):
    by: str
    text: str
    at: str


class ClaimView(BaseModel):
    """Who is looking at a waiting job, as the snapshot and the queue show it (docs/protocol.md § Claims)."""

    reviewer: str
    expires_at: str


class Claim(ClaimView):
    """The answer to ``POST /jobs/{id}/claim``: ``claimed_at`` stays while the holder renews."""

    claimed_at: str


class ClaimReleased(BaseModel):
    job_id: str
    released: bool  # false: there was no claim (it had expired, or was never taken)


class QuorumVote(BaseModel):
    reviewer: str
    at: str


class QuorumView(BaseModel):
    """How far the active pause's quorum has got: ``needed`` compatible submissions of the
    ``invited`` reviewers under ``policy``, the votes so far."""

    needed: int
    invited: int | None = None  # the job's review_quorum (None in snapshots archived before the policy)
    policy: QuorumPolicy = "all"
    votes: list[QuorumVote] = Field(default_factory=list)


class JobSnapshot(BaseModel):
    job_id: str
    status: JobStatus
    version: int
    round: int
    created_at: str
    updated_at: str
    image: ImageRef
    box_list: list[Box]
    approved_box_list: list[Box]
    active_pause: Pause | None
    pending_actions: list[str]
    current_node: CurrentNode | None
    # The job's live SEGMENT_SUBJECT nodes, one per subject being cut (statecore.subjects); while they
    # run, ``current_node`` is the node that came before them.
    subject_nodes: list[CurrentNode] = Field(default_factory=list)
    reason_code: str | None = None
    cancel_requested: bool = False
    empty_selection: bool = False
    claim: ClaimView | None = None
    quorum: QuorumView | None = None  # jobs created with review_quorum >= 2 (docs/protocol.md § Quorum)
    # The auto-approve policy that approved the detector's list (``policy:<name>@<hash>``; docs/protocol.md
    # § Auto-approval); None when a person decided it.
    decided_by: str | None = None
    # Each approved subject's status so far (docs/protocol.md § Cut-out quality): empty until the
    # segmentation reports; WAITING_REVIEW / REFINING during a mask review; as /results once ended.
    subjects: list[SubjectResult] = Field(default_factory=list)
    # Notes that are not changes of the job (docs/protocol.md § Flags, skips and comments).
    flag: JobFlag | None = None
    comments: list[JobComment] = Field(default_factory=list)


class QuorumProgress(BaseModel):
    """A submission's part in its quorum: VOTE_RECORDED (more reviewers needed), QUORUM_REACHED (the
    lists agreed: the pause is consumed) or QUORUM_DISAGREED (a reconciliation pause opened)."""

    needed: int
    received: int
    reviewers: list[str]
    outcome: Literal["VOTE_RECORDED", "QUORUM_REACHED", "QUORUM_DISAGREED"]
    invited: int | None = None  # the job's review_quorum (None in answers recorded before the policy)
    policy: QuorumPolicy = "all"


class JobSummary(BaseModel):
    job_id: str
    status: JobStatus
    version: int
    created_at: str
    updated_at: str
    submitter: str
    box_count: int = 0
    stage: str | None = None
    pause_created_at: str | None = None
    claim: ClaimView | None = None
    batch: str | None = None  # `hitl submit --batch NAME` (its Idempotency-Key is <batch>:<sha256>)
    review_quorum: int = 1  # distinct reviewers each pause needs (docs/protocol.md § Quorum)
    quorum_policy: QuorumPolicy = "all"  # how their submissions decide (docs/protocol.md § Quorum)
    flag: JobFlag | None = None  # flagged for a lead (docs/protocol.md § Flags, skips and comments)


class JobList(BaseModel):
    jobs: list[JobSummary]
    next_cursor: str | None = None


class CreateJobResponse(BaseModel):
    accepted: bool = True
    job_id: str
    status: JobStatus
    version: int


class Subject(Strict):
    box_id: str | None = None
    candidate_id: str | None = None
    bbox: BBox
    label: str | None = Field(default=None, max_length=200)
    target_policy: Literal["SEGMENT", "SKIP"] = "SEGMENT"

    @field_validator("bbox", mode="before")
    @classmethod
    def _bbox(cls, v: Any) -> BBox:
        if not isinstance(v, (list, tuple)):
            raise ValueError("bbox must be a list of four numbers")
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in v):
            raise ValueError("bbox must contain numbers only")
        return check_bbox(v)


MAX_SUBJECTS = 500
SNAPSHOT_ID_PATTERN = r"^snap_[0-9a-f]{20}$"  # statecore.plan.snapshot_id


class Point(Strict):
    """A reviewer's click on the image: ``positive`` (part of the subject) or not."""

    x: float = Field(ge=0, allow_inf_nan=False)
    y: float = Field(ge=0, allow_inf_nan=False)
    positive: bool = True


MAX_POINTS = 64


class MaskDecision(Strict):
    """A reviewer's decision on one subject of a mask review (docs/protocol.md § Cut-out quality)."""

    box_id: str = Field(min_length=1, max_length=128)
    decision: Literal["ACCEPT", "REJECT", "REFINE"]
    reason: str | None = Field(default=None, max_length=500)
    points: list[Point] = Field(default_factory=list, max_length=MAX_POINTS)


class InterventionRequest(Strict):
    """A box stage's submission carries ``subjects`` (the complete list); a mask review's carries
    ``decisions`` (one per listed subject) and no ``subjects``. Which one the pause needs is checked
    against its stage, after the 409 gates (``statecore.decide``)."""

    intervention_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$")
    pause_token: str = Field(min_length=1, max_length=128)
    base_version: int = Field(ge=0, le=2**63 - 1)  # a Redis integer; beyond it is a 400, not a 500
    subjects: list[Subject] | None = Field(default=None, max_length=MAX_SUBJECTS)
    decisions: list[MaskDecision] | None = Field(default=None, max_length=MAX_SUBJECTS)
    # The pause's snapshot the reviewer was shown; checked after the pause token (the fifth gate).
    snapshot_id: str | None = Field(default=None, pattern=SNAPSHOT_ID_PATTERN)

    def hashed_body(self) -> dict[str, Any]:
        """The body as its idempotency hash covers it: without an absent ``snapshot_id``, so a body
        recorded before the field existed still replays."""
        body = self.model_dump(mode="json")
        for absent in ("snapshot_id", "decisions", "subjects"):
            if body.get(absent) is None:
                body.pop(absent, None)
        return body

    @model_validator(mode="after")
    def _one_kind(self) -> InterventionRequest:
        if self.subjects is None and self.decisions is None:
            raise ValueError("a submission needs 'subjects' (a box stage) or 'decisions' (a mask review)")
        if self.subjects is not None and self.decisions is not None:
            raise ValueError("a submission carries 'subjects' or 'decisions', not both")
        return self

    @field_validator("base_version", mode="before")
    @classmethod
    def _int_only(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("base_version must be an integer")
        return v


class Diff(BaseModel):
    kept: list[str]
    added: list[str]
    deleted: list[str]


class InterventionResponse(BaseModel):
    intervention_id: str
    job_id: str
    accepted: bool = True
    status: JobStatus
    version: int
    next_node_type: Literal["VALIDATE_MANUAL_BOX_LIST", "PROCESS_APPROVED_BOX_LIST", "FINALIZE_RESULTS"] | None
    diff: Diff
    quorum: QuorumProgress | None = None  # only for jobs created with review_quorum >= 2


class Event(BaseModel):
    id: int
    type: str
    job_id: str
    version: int
    at: str
    data: dict[str, Any] = Field(default_factory=dict)


class NodeCommand(BaseModel):
    """One outbox entry. ``node_type`` and ``input`` stay plain on the wire: an executor answers
    a type it does not know with ``UNSUPPORTED_NODE_TYPE`` and reads ``input`` through
    ``statecore.nodes.parse_input`` (docs/protocol.md § Executors and the outbox)."""

    node_instance_id: str
    node_type: str
    job_id: str
    attempt: int = 0  # starts of this node so far (a re-dispatch carries the count on)
    enqueued_at: str
    not_before_ms: int | None = None  # a re-dispatch's backoff: dispatchers start it no earlier
    input: dict[str, Any] = Field(default_factory=dict)


class NodeReport(BaseModel):
    """An executor's answer; the decider reads ``output`` through ``statecore.nodes.parse_output``."""

    node_instance_id: str
    node_type: str
    job_id: str
    outcome: Literal["SUCCEEDED", "FAILED", "TIMED_OUT"]
    error_code: str | None = None
    error_message: str | None = None
    output: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _error_has_code(self) -> NodeReport:
        if self.outcome != "SUCCEEDED" and not self.error_code:
            self.error_code = "NODE_" + self.outcome
        return self


class SubjectResult(BaseModel):
    box_id: str
    bbox: BBox
    label: str | None = None
    # QUEUED: its SEGMENT_SUBJECT node waits in the outbox; SEGMENTING: the node runs (it segments, gates
    # and refines the mask: statecore.subjects); WAITING_REVIEW: in a mask review; REFINING: a reviewer's
    # points are being segmented; SUCCEEDED: cut (SPEC §13's CUT); CANCELLED: the job was cancelled
    # while it was QUEUED, SEGMENTING, WAITING_REVIEW or REFINING (a finished job's subjects are finished).
    status: Literal[
        "QUEUED", "SEGMENTING", "SUCCEEDED", "FAILED", "REJECTED", "WAITING_REVIEW", "REFINING", "CANCELLED"
    ]
    attempts: int = 0  # starts of this subject's SEGMENT_SUBJECT nodes (a retry counts again)
    reason: str | None = None
    mask_url: str | None = None
    cutout_url: str | None = None
    # The gate's verdict on the mask shipped (None: the gate is off, or no mask), the refinements
    # tried before it, and who let the mask through: "gate" (it passed) or null (not decided: it
    # still fails after its refinements and waits for the mask review of docs/protocol.md).
    quality: QualityVerdict | None = None
    refinements: list[Refinement] = Field(default_factory=list)
    decided_by: str | None = None


class JobResults(BaseModel):
    job_id: str
    status: JobStatus
    reason_code: str | None = None
    subjects: list[SubjectResult]


class ClaimedJob(Claim):
    """``POST /jobs/{id}/claim?snapshot=true``: the claim and the job as ``GET /jobs/{id}`` shows it
    right after it (docs/protocol.md § Claims), so opening a job is one round trip."""

    snapshot: JobSnapshot
