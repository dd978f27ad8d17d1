"""The reviewer queue: jobs waiting for a review, the oldest pause first (docs/protocol.md § Routes)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from client.times import parse_time
from statecore.models import JobSummary

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


QUEUE_HEADERS = ["Job", "Stage", "Waiting for", "Boxes"]
TABLE_HEADERS = ["Image", *QUEUE_HEADERS]  # the table shows a thumbnail before each row
FILE_ROUTE = "/gradio_api/file="  # how Gradio serves a file under launch(allowed_paths=…)


def thumb_cell(path: str | None, job_id: str) -> str:
    """The thumbnail column's markdown: the image, or nothing while it is not made yet."""
    return f"![{job_id}]({FILE_ROUTE}{path})" if path else ""


def waiting_jobs(jobs: Iterable[JobSummary]) -> list[JobSummary]:
    """Jobs with an open pause (their summary names its stage), oldest pause first."""
    far = datetime.max.replace(tzinfo=UTC)
    waiting = [j for j in jobs if j.stage]
    return sorted(waiting, key=lambda j: (parse_time(j.pause_created_at) or parse_time(j.updated_at) or far, j.job_id))


def queue_rows(jobs: Iterable[JobSummary], now: datetime | None = None, stage: str | None = None) -> list[list[Any]]:
    """Rows of the queue table, the stage in words; ``stage`` (a raw stage name) filters."""
    now = now or datetime.now(UTC)
    rows = []
    for j in waiting_jobs(jobs):
        if stage and stage != ALL_STAGES and j.stage != stage:
            continue
        since = parse_time(j.pause_created_at) or parse_time(j.updated_at)
        age = format_age((now - since).total_seconds()) if since else "?"
        rows.append([j.job_id, stage_name(j.stage), age, j.box_count])
    return rows


def next_job_id(jobs: Iterable[JobSummary], exclude: Iterable[str | None] = ()) -> str | None:
    skip = set(exclude)
    return next((j.job_id for j in waiting_jobs(jobs) if j.job_id not in skip), None)
