"""SSE framing: a comment line whenever nothing was sent for the keep-alive interval, then events."""

from __future__ import annotations

import asyncio
import json

from hitl_review.serve_app.routes.events import sse_frame, sse_lines
from hitl_review.statecore.models import Event


async def test_keepalive_comments_then_event_frame():
    """Keep-alive comments while nothing comes; the event held back until two of them were sent, so the
    test does not depend on how fast a loaded machine runs the loop (a 0.35 s sleep against a 0.1 s
    keep-alive once saw one keep-alive in a full run)."""
    release = asyncio.Event()

    async def slow_events():
        await release.wait()
        yield [
            Event(
                id=7,
                type="PAUSE_OPENED",
                job_id="job_x",
                version=3,
                at="2026-01-01T00:00:00.000Z",
                data={"status": "WAITING_USER_SELECTION"},
            )
        ]

    frames: list[str] = []

    async def collect() -> None:
        async for f in sse_lines(slow_events(), keepalive_s=0.05):
            frames.append(f)
            if frames.count(": keep-alive\n\n") == 2:
                release.set()

    await asyncio.wait_for(collect(), 10)
    assert frames[0].startswith(":")
    assert frames.count(": keep-alive\n\n") >= 2
    last = frames[-1]
    assert last.startswith("id: 7\nevent: PAUSE_OPENED\ndata: ") and last.endswith("\n\n")
    assert json.loads(last.split("data: ", 1)[1])["version"] == 3


def test_frame_is_one_data_line():
    ev = Event(id=1, type="JOB_CREATED", job_id="j", version=1, at="x", data={"text": "a\nb"})
    frame = sse_frame(ev)
    assert frame.count("\ndata: ") == 1 and frame.count("\n") == 4  # the newline inside data is escaped


async def test_a_batch_of_events_is_one_chunk_of_frames():
    """What one wake-up brought goes out as one chunk (through Ray Serve, one streamed item per chunk)."""

    async def one_batch():
        yield [Event(id=i, type="NODE_STARTED", job_id="j", version=i, at="x", data={}) for i in (1, 2, 3)]

    chunks = [f async for f in sse_lines(one_batch(), keepalive_s=5)]
    assert chunks[0] == ": stream open\n\n" and len(chunks) == 2
    frames = chunks[1].split("\n\n")[:-1]
    assert [f.split("\n", 1)[0] for f in frames] == ["id: 1", "id: 2", "id: 3"]
