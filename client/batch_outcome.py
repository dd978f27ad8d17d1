"""What a batch run knows about each file and about the whole run: the batch name and the
Idempotency-Key it gives each file, the progress buckets, ``FileOutcome`` (one file, and its
manifest line) and ``BatchSummary`` (what ``hitl submit`` prints and exits with)."""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hitl_review.statecore.states import WAITING

from .batch_files import Skipped
from .waiting import TERMINAL_STATUSES

DEFAULT_BATCH = "default"
ENDED_WELL: frozenset[str] = frozenset({"SUCCEEDED", "PARTIAL_SUCCEEDED", "EMPTY_SELECTION"})
_BATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")

# Progress buckets, in display order.
QUEUED, SUBMITTED, WAITING_REVIEW, PROCESSING, DONE, FAILED = (
    "queued",
    "submitted",
    "waiting for review",
    "processing",
    "done",
    "failed",
)
CATEGORIES = (QUEUED, SUBMITTED, WAITING_REVIEW, PROCESSING, DONE, FAILED)
_PROCESSING = frozenset({"VALIDATING_MANUAL_BOXES", "PROCESSING_APPROVED_SUBJECTS", "FINALIZING_RESULTS"})


def check_batch_name(batch: str) -> str:
    if not _BATCH_NAME.match(batch):
        raise ValueError(f"batch name {batch!r}: use 1-64 letters, digits, '_', '.', '-' (starting alphanumeric)")
    return batch


def idempotency_key(file_bytes: bytes, batch: str = DEFAULT_BATCH) -> str:
    """``<batch>:<sha256 hex>``: the same bytes in the same batch always give the same key."""
    return f"{check_batch_name(batch)}:{hashlib.sha256(file_bytes).hexdigest()}"


def category(status: str | None, *, error: str | None = None, accepted: bool = False) -> str:
    """The progress bucket of a file from its last known job status."""
    if status in ENDED_WELL:
        return DONE
    if status in TERMINAL_STATUSES:
        return FAILED
    if status in WAITING:
        return WAITING_REVIEW
    if status in _PROCESSING:
        return PROCESSING
    if status is not None or accepted:
        return SUBMITTED
    return FAILED if error else QUEUED


# ---------------------------------------------------------------------- outcome & summary


@dataclass
class FileOutcome:
    path: Path
    sha256: str | None = None
    idempotency_key: str | None = None
    job_id: str | None = None
    status: str | None = None
    final_status: str | None = None
    replayed: bool = False
    resumed: bool = False
    error: str | None = None
    out_dir: Path | None = None

    @property
    def accepted(self) -> bool:
        return self.job_id is not None

    @property
    def ended_well(self) -> bool:
        return self.final_status in ENDED_WELL

    @property
    def category(self) -> str:
        return category(self.final_status or self.status, error=self.error, accepted=self.accepted)

    def record(self, batch: str) -> dict[str, Any]:
        """The manifest line for this file as it stands now."""
        return {
            "path": str(self.path.resolve()),
            "sha256": self.sha256,
            "batch": batch,
            "idempotency_key": self.idempotency_key,
            "job_id": self.job_id,
            "status": self.status,
            "final_status": self.final_status,
            "error": self.error,
            "out_dir": str(self.out_dir) if self.out_dir else None,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"], d["out_dir"] = str(self.path), str(self.out_dir) if self.out_dir else None
        d["accepted"], d["ended_well"] = self.accepted, self.ended_well
        return d


@dataclass
class BatchSummary:
    batch: str
    waited: bool
    files: list[FileOutcome]
    skipped: list[Skipped]
    manifest: Path | None = None
    aborted: str | None = None
    interrupted: bool = False

    def counts(self) -> dict[str, int]:
        c = Counter(f.category for f in self.files)
        return {k: c[k] for k in CATEGORIES if c[k]}

    @property
    def ok(self) -> bool:
        """Every file accepted (no non-images among the inputs) and, when waiting, every job ended well."""
        if self.aborted or self.interrupted or self.skipped or not self.files:
            return False
        if not all(f.accepted for f in self.files):
            return False
        return all(f.ended_well for f in self.files) if self.waited else True

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "waited": self.waited,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "aborted": self.aborted,
            "interrupted": self.interrupted,
            "manifest": str(self.manifest) if self.manifest else None,
            "files": [f.to_dict() for f in self.files],
            "skipped": [{"path": str(s.path), "reason": s.reason} for s in self.skipped],
        }
