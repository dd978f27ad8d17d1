"""What goes on the wire, without sending it: paths, ids, the image upload, request bodies, and the
reply models the clients return (docs/protocol.md § Routes)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from hitl_review.statecore.media import CONTENT_TYPES, EXTENSIONS, sniff
from hitl_review.statecore.models import Box, CreateJobResponse, InterventionResponse, Subject

API = "/api/v1"
USER_AGENT = "hitl-client/0.1"

ImageInput = bytes | bytearray | memoryview | str | os.PathLike[str]
SubjectInput = dict[str, Any] | Subject | Box


class SubmitResult(CreateJobResponse):
    """The POST /jobs answer, plus whether it was an idempotent replay and the HTTP status (202 or 200)."""

    replayed: bool = False
    status_code: int = 202


class InterventionResult(InterventionResponse):
    """The intervention answer, plus whether it was a replay and the exact bytes the server sent."""

    replayed: bool = False
    raw: bytes = b""


class DeadLetter(BaseModel):
    """A node report or command given up on after its retries (GET /admin/dead-letters)."""

    id: str
    job_id: str
    kind: Literal["report", "command"]
    reason: str
    at: str
    payload: dict[str, Any]


class ReplayResult(BaseModel):
    """What replaying a dead letter did: APPLIED, DUPLICATE, REPORT_IGNORED (a report) or REQUEUED (a command)."""

    id: str
    job_id: str
    kind: Literal["report", "command"]
    result: str


def new_intervention_id() -> str:
    """A fresh id for one reviewer submission; reuse it when retrying that same submission."""
    return f"iv_{uuid.uuid4().hex}"


def new_request_id() -> str:
    return uuid.uuid4().hex


def normalize_base_url(base_url: str) -> str:
    """``http://host:8000/`` or ``http://host:8000/api/v1`` → ``http://host:8000``."""
    url = base_url.strip().rstrip("/")
    if url.endswith(API):
        url = url[: -len(API)].rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url


def read_image(image: ImageInput, filename: str | None = None) -> tuple[bytes, str, str]:
    """(bytes, file name, content type) for the multipart ``image`` field; reads a path from disk."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        data, name = bytes(image), filename or "image"
    else:
        path = Path(image)
        data, name = path.read_bytes(), filename or path.name
    kind = sniff(data[:16])
    if kind and not Path(name).suffix:
        name += EXTENSIONS[kind]
    return data, name, CONTENT_TYPES.get(kind or "", "application/octet-stream")


def subject_dict(subject: SubjectInput) -> dict[str, Any]:
    if isinstance(subject, Box):
        return {
            "box_id": subject.box_id,
            "bbox": list(subject.bbox),
            "label": subject.label,
            "target_policy": subject.target_policy,
        }
    if isinstance(subject, Subject):
        return subject.model_dump(mode="json", exclude_none=True)
    return dict(subject)


def was_replayed(resp: httpx.Response) -> bool:
    return str(resp.headers.get("Idempotent-Replayed", "")).strip().lower() == "true"


def dead_letter_path(dead_letter_id: str, suffix: str = "") -> str:
    return f"{API}/admin/dead-letters/{quote(dead_letter_id, safe='')}{suffix}"


def job_path(job_id: str, suffix: str = "") -> str:
    return f"{API}/jobs/{quote(job_id, safe='')}{suffix}"
