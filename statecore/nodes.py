"""The node contract: what each node type takes and what it returns.

See docs/protocol.md § Executors and the outbox. The decider builds a node's input and reads
its output; the executors read the input and build the output. Both use the models here, so
every field is spelled once. On the wire (outbox entries, Ray calls, reports) inputs and
outputs stay JSON objects: each end parses them with ``parse_input`` / ``parse_output``.

Unknown keys are ignored (a newer peer may send more); a known key with the wrong type, or a
required key that is missing, is an error that no retry can cure, so both parsers raise a
non-retryable ``NodeExecutionError``: ``INVALID_NODE_INPUT``, ``INVALID_NODE_OUTPUT``, or
``UNSUPPORTED_NODE_TYPE`` for a type without a contract.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from .errors import NodeExecutionError
from .models import BBox, Box, DetectorEvidence, ImageRef, QualityVerdict, Refinement, Validation
from .states import NodeType

INVALID_NODE_INPUT = "INVALID_NODE_INPUT"
INVALID_NODE_OUTPUT = "INVALID_NODE_OUTPUT"
UNSUPPORTED_NODE_TYPE = "UNSUPPORTED_NODE_TYPE"


def _number(v: Any) -> float:
    """A finite real number; numpy scalars pass (backends return them), strings and bools do not."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"must be a number, not {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f):
        raise ValueError("must be a finite number")
    return f


def _flag(v: Any) -> bool:
    """A bool; numpy's bool scalar passes, 0/1 and "yes" do not."""
    if isinstance(v, bool):
        return v
    if type(v).__module__ == "numpy" and type(v).__name__ in ("bool", "bool_"):
        return bool(v)
    raise ValueError(f"must be true or false, not {type(v).__name__}")


def _coords(v: Any) -> BBox:
    if not isinstance(v, (list, tuple)) or len(v) != 4:
        raise ValueError("must be a list of four numbers [x1, y1, x2, y2]")
    x1, y1, x2, y2 = (_number(x) for x in v)
    return (x1, y1, x2, y2)


Number = Annotated[float, BeforeValidator(_number)]
Flag = Annotated[bool, BeforeValidator(_flag)]
Coords = Annotated[BBox, BeforeValidator(_coords)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --------------------------------------------------------------------------- inputs


class NodeBox(_Wire):
    """A box as a node receives it: the control plane sends the whole ``Box``; an executor needs
    only ``box_id``, ``bbox`` and ``label`` (hand-written inputs may carry no more)."""

    box_id: str
    bbox: Coords
    label: str | None = None
    score: float | None = None
    source: Literal["model", "manual"] | None = None
    target_policy: Literal["SEGMENT", "SKIP"] = "SEGMENT"
    validation: Validation | None = None
    evidence: DetectorEvidence | None = Field(default=None, exclude_if=lambda v: v is None)

    @classmethod
    def of(cls, box: Box) -> NodeBox:
        return cls.model_validate(box.model_dump(mode="json"))


class DetectInput(_Wire):
    image: ImageRef

    def work(self) -> list[NodeBox]:
        return []


class ValidateInput(_Wire):
    """Round 1 or 2 of naming manual boxes (docs/protocol.md § Second round)."""

    image: ImageRef
    round: int = 1
    box_list: list[NodeBox] = Field(default_factory=list)
    items_to_validate: list[NodeBox]
    reusable_valid_items: list[str] = Field(default_factory=list)
    deleted_box_ids: list[str] = Field(default_factory=list)

    def work(self) -> list[NodeBox]:
        return self.items_to_validate


class PromptPoint(_Wire):
    x: Number
    y: Number
    positive: Flag = True


class ProcessInput(_Wire):
    """``prompts``: a reviewer's points per box (a mask review's REFINE, statecore.mask_review): those
    boxes are segmented from their box and points, and their masks are final (not gated again)."""

    image: ImageRef
    approved_box_list: list[NodeBox]
    prompts: dict[str, list[PromptPoint]] = Field(default_factory=dict)

    def work(self) -> list[NodeBox]:
        return self.approved_box_list


class FinalizeInput(_Wire):
    """Run by the control plane itself: the results are already in the job."""

    def work(self) -> list[NodeBox]:
        return []


NodeInput = DetectInput | ValidateInput | ProcessInput | FinalizeInput


def image_to_read(inp: NodeInput) -> ImageRef | None:
    """The image running the node reads, or None (no image, or no boxes to work on)."""
    if isinstance(inp, DetectInput) or (not isinstance(inp, FinalizeInput) and inp.work()):
        return inp.image
    return None


# --------------------------------------------------------------------------- outputs


class Detection(_Wire):
    """One proposal; the control plane clips it to the image and drops slivers."""

    bbox: Coords
    label: str | None = None
    score: Number | None = None
    # What the backend saw around the box, where it says (no key where it does not).
    evidence: DetectorEvidence | None = Field(default=None, exclude_if=lambda v: v is None)


class DetectOutput(_Wire):
    boxes: list[Detection]
    backend: str = ""


# The reason a manual box without a label goes back to the reviewer (round 1) or is rejected (round 2):
# docs/protocol.md § Second round. A reason may go on after it (": " and why).
NAME_THIS_BOX = "name this box"


class Verdict(_Wire):
    """One manual box's verdict. ``label``: the validator's name for a box sent without one (None:
    not named), ``label_score`` how sure its backend is, ``label_source`` which backend named it."""

    box_id: str
    passed: Flag
    score: Number | None = None
    reason: str | None = None
    label: str | None = None
    label_score: Number | None = None
    label_source: str | None = None


class ValidateOutput(_Wire):
    results: list[Verdict]
    backend: str = ""
    threshold: Number | None = None
    policy_version: str | None = None


class SubjectOutcome(_Wire):
    """One approved box after segmentation; ``mask`` and ``cutout`` are artifact names; ``quality`` the
    gate's verdict on that mask and ``refinements`` what was tried before it (the gate on: SPEC §13)."""

    box_id: str
    status: Literal["SUCCEEDED", "FAILED"]
    reason: str | None = None
    mask: str | None = None
    cutout: str | None = None
    quality: QualityVerdict | None = None
    refinements: list[Refinement] = Field(default_factory=list)


class ProcessOutput(_Wire):
    subjects: list[SubjectOutcome]
    backend: str = ""


class FinalizeOutput(_Wire):
    pass


NodeOutput = DetectOutput | ValidateOutput | ProcessOutput | FinalizeOutput


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class NodeSpec:
    node_type: NodeType
    input: type[NodeInput]
    output: type[NodeOutput]
    runs_in: Literal["model", "control_plane"]


NODES: dict[NodeType, NodeSpec] = {
    s.node_type: s
    for s in (
        NodeSpec(NodeType.DETECT_SUBJECTS, DetectInput, DetectOutput, "model"),
        NodeSpec(NodeType.VALIDATE_MANUAL_BOX_LIST, ValidateInput, ValidateOutput, "model"),
        NodeSpec(NodeType.PROCESS_APPROVED_BOX_LIST, ProcessInput, ProcessOutput, "model"),
        # One subject (statecore.subjects): the same contract with one box in ``approved_box_list``.
        NodeSpec(NodeType.SEGMENT_SUBJECT, ProcessInput, ProcessOutput, "model"),
        NodeSpec(NodeType.FINALIZE_RESULTS, FinalizeInput, FinalizeOutput, "control_plane"),
    )
}
MODEL_NODES = frozenset(t for t, s in NODES.items() if s.runs_in == "model")
CONTROL_PLANE_NODES = frozenset(t for t, s in NODES.items() if s.runs_in == "control_plane")


def spec_of(node_type: str) -> NodeSpec:
    """The contract of ``node_type``; ``UNSUPPORTED_NODE_TYPE`` for one without a contract."""
    known = node_type in NodeType.__members__
    spec = NODES.get(NodeType(node_type)) if known else None
    if spec is None:
        raise NodeExecutionError(
            f"unsupported workflow node type: {node_type}", code=UNSUPPORTED_NODE_TYPE, retryable=False
        )
    return spec


def _explain(exc: ValidationError, limit: int = 3) -> str:
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()[:limit]]
    more = exc.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _parse(model: type[BaseModel], raw: Any, what: str, code: str, node_type: str) -> Any:
    if isinstance(raw, model):
        return raw
    if not isinstance(raw, Mapping):
        raise NodeExecutionError(
            f"{node_type} {what} must be a JSON object, not {type(raw).__name__}", code=code, retryable=False
        )
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        raise NodeExecutionError(
            f"{node_type} {what} does not match the node contract: {_explain(exc)}", code=code, retryable=False
        ) from exc


def parse_input(node_type: str, raw: Any) -> NodeInput:
    spec = spec_of(node_type)
    result: NodeInput = _parse(spec.input, raw, "input", INVALID_NODE_INPUT, node_type)
    return result


def parse_output(node_type: str, raw: Any) -> NodeOutput:
    spec = spec_of(node_type)
    result: NodeOutput = _parse(spec.output, raw, "output", INVALID_NODE_OUTPUT, node_type)
    return result


def check_answers(output: NodeOutput, node_input: Mapping[str, Any] | None) -> None:
    """An output that parses must still answer what the node was asked: a validator's verdicts are
    exactly one per box of ``items_to_validate`` (none missing, none unknown, none twice), else
    ``INVALID_NODE_OUTPUT`` (a box without a verdict would silently drop out of the job).
    ``node_input``: the node's input as the job keeps it; None (a job stored before it was kept)
    checks nothing."""
    if not isinstance(output, ValidateOutput) or node_input is None:
        return
    asked = [str(b.get("box_id")) for b in node_input.get("items_to_validate") or [] if isinstance(b, Mapping)]
    answered = Counter(r.box_id for r in output.results)
    found = {
        "no verdict for": [b for b in asked if b not in answered],
        "verdicts for boxes not asked about": sorted(set(answered) - set(asked)),
        "more than one verdict for": sorted(b for b, n in answered.items() if n > 1),
    }
    problems = [f"{what} {', '.join(ids[:5])}{' …' if len(ids) > 5 else ''}" for what, ids in found.items() if ids]
    if problems:
        raise NodeExecutionError(
            f"{NodeType.VALIDATE_MANUAL_BOX_LIST.value} output does not answer the boxes asked about: "
            + "; ".join(problems),
            code=INVALID_NODE_OUTPUT,
            retryable=False,
        )
