"""The reviewer queue: jobs waiting for a review, the oldest pause first (docs/protocol.md § Routes)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from hitl_review.client.times import parse_time
from hitl_review.statecore.models import ClaimView, JobSummary

from .editor import ALL_STAGES, stage_name


def format_age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {(s % 3600) // 60:02d} min"
    return f"{s // 86400} d {(s % 86400) // 3600} h"


QUEUE_HEADERS = ["Job", "Stage", "Waiting for", "Boxes", "Reviewer"]
TABLE_HEADERS = ["Image", *QUEUE_HEADERS]  # the table shows a thumbnail before each row
FILE_ROUTE = "/gradio_api/file="  # how Gradio serves a file under launch(allowed_paths=…)
FLAG_SHOWN = 80  # characters of a flag's reason in the queue's stage cell


def thumb_cell(path: str | None, job_id: str) -> str:
    """The thumbnail column's markdown: the image, or nothing while it is not made yet."""
    return f"![{job_id}]({FILE_ROUTE}{path})" if path else ""


def waiting_jobs(jobs: Iterable[JobSummary]) -> list[JobSummary]:
    """Jobs with an open pause (their summary names its stage), oldest pause first."""
    far = datetime.max.replace(tzinfo=UTC)
    waiting = [j for j in jobs if j.stage]
    return sorted(waiting, key=lambda j: (parse_time(j.pause_created_at) or parse_time(j.updated_at) or far, j.job_id))


def claim_left_s(claim: ClaimView | None, now: datetime | None = None) -> float:
    """Seconds until ``claim`` expires (0 when there is none, or it is over)."""
    until = parse_time(claim.expires_at) if claim is not None else None
    return max(0.0, (until - (now or datetime.now(UTC))).total_seconds()) if until else 0.0


def presence_text(claim: ClaimView | None, me: str | None = None, now: datetime | None = None) -> str:
    """Who is looking at a job (docs/protocol.md § Claims): "rev1 is reviewing", or nothing."""
    if claim is None or claim_left_s(claim, now) <= 0:
        return ""
    return "you are reviewing" if me and claim.reviewer == me else f"{claim.reviewer} is reviewing"


def queue_rows(
    jobs: Iterable[JobSummary],
    now: datetime | None = None,
    stage: str | None = None,
    me: str | None = None,
    batch: str | None = None,
    flagged: bool = False,
) -> list[list[Any]]:
    """Rows of the queue table, the stage in words (and "⚑ reason" when flagged for a lead) and who is
    reviewing each job (``me``: "you"); ``stage`` (a raw stage name), ``batch`` (as ``hitl submit
    --batch`` named it) and ``flagged`` (only the flagged jobs) filter."""
    now = now or datetime.now(UTC)
    rows = []
    for j in waiting_jobs(jobs):
        if stage and stage != ALL_STAGES and j.stage != stage:
            continue
        if (batch and j.batch != batch) or (flagged and j.flag is None):
            continue
        since = parse_time(j.pause_created_at) or parse_time(j.updated_at)
        age = format_age((now - since).total_seconds()) if since else "?"
        mark = f" · ⚑ {j.flag.reason[:FLAG_SHOWN]}" if j.flag else ""  # docs/protocol.md § Flags, skips and comments
        rows.append([j.job_id, stage_name(j.stage) + mark, age, j.box_count, presence_text(j.claim, me, now)])
    return rows


NOTHING_WAITING = "No other job is waiting for review."


def nothing_to_open_text(
    jobs: Iterable[JobSummary], me: str | None, on_screen: str | None, more: bool = False, now: datetime | None = None
) -> str:
    """What N says when no job was left to claim, from the waiting jobs ``jobs`` (one page of them; ``more``:
    there are others): every other one being reviewed by someone else (and by whom), or none waiting.
    ``me``: this reviewer; ``on_screen``: the job the page shows."""
    held = [
        j
        for j in waiting_jobs(jobs)
        if j.job_id != on_screen and j.claim is not None and claim_left_s(j.claim, now) > 0 and j.claim.reviewer != me
    ]
    if not held:
        return NOTHING_WAITING
    names = ", ".join(sorted({j.claim.reviewer for j in held if j.claim is not None}))
    if len(held) == 1 and not more:
        return f"No other job is free: the other waiting job is being reviewed by {names}."
    count = f"{len(held)}+" if more else str(len(held))
    return f"No other job is free: the {count} other waiting jobs are being reviewed by {names}."


def next_job_id(jobs: Iterable[JobSummary], exclude: Iterable[str | None] = ()) -> str | None:
    skip = set(exclude)
    return next((j.job_id for j in waiting_jobs(jobs) if j.job_id not in skip), None)
