"""Reads of a finished job Redis no longer holds, answered from the archive with the same bodies
(docs/protocol.md § Archive). An archive that cannot be read answers like one without the job
(a 404, never a 500)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from hitl_review.statecore.models import Event

from ..routes.events import BATCH_MAX, sse_lines

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive
    from hitl_review.archive.reads import ArchivedView


async def archived(archive: Archive | None, job_id: str) -> ArchivedView | None:
    if archive is None:
        return None
    from hitl_review.archive import reads

    return await asyncio.to_thread(reads.lookup, archive, job_id)


async def archived_events(archive: Archive, job_id: str, after: int) -> AsyncIterator[str]:
    """The job's event history after ``after`` as SSE frames; the stream ends with it (a finished
    job has no live events)."""
    from hitl_review.archive import reads

    found: list[Event] | None = await asyncio.to_thread(reads.events, archive, job_id, after)
    history = found or []

    async def replay() -> AsyncIterator[list[Event]]:
        for start in range(0, len(history), BATCH_MAX):
            yield history[start : start + BATCH_MAX]

    async for line in sse_lines(replay()):
        yield line
