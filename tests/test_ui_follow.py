"""What a follower says after this reviewer's own submission, against a real API (the uvicorn harness, a
real redis-server): the job's progress to its end, never the review again, never a blanked confirmation,
and never "Another reviewer submitted first." about the submission itself (``ReviewerState.sending``);
its progress events gathered into a few reads of the job (``ui.pump.PROGRESS_EVENTS``)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import gradio as gr

from harness.tokens import TOKENS
from hitl_review.client import AsyncHitlClient
from hitl_review.statecore.models import Event, JobSnapshot
from hitl_review.ui.pump import PROGRESS_EVENTS, follow_job
from hitl_review.ui.session import ReviewerState

from .test_ui_callbacks import make_callbacks, updates, visible, waiting_job


def test_after_a_submission_the_follower_never_shows_the_review_again(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 67)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    opened = cb.open_job(st, job)
    answer = cb.on_submit(st, opened[comps.annotator])
    assert answer[comps.banner_md].startswith("Submitted")
    follower = cb.follow(st, None)  # type: ignore[arg-type]  # no gr.Request off a browser
    got = asyncio.run(updates(follower, until=lambda u: "ended" in str(u.get(comps.banner_md, "")), timeout=60))
    assert not st.reviewing  # so no view of the review is said again
    assert not any(visible(u[comps.review_col.style]) for u in got if comps.review_col.style in u)
    banners = [u[comps.banner_md] for u in got if comps.banner_md in u]
    assert "" not in banners and "Another reviewer submitted first." not in banners, banners


def test_the_pages_follower_ends_on_an_update_that_changes_nothing(api_server: Any, tmp_path: Path) -> None:
    """Gradio's completion message repeats a generator's last update after it returned: that must not be the
    ended job's view, which could then land over the next job's panel."""
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 68)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    opened = cb.open_job(st, job)
    cb.on_submit(st, opened[comps.annotator])
    page = cb.follow_on_page(st, None)  # type: ignore[arg-type]  # no gr.Request off a browser
    got = asyncio.run(updates(page, until=lambda u: False, timeout=60))
    assert any("ended" in str(u.get(comps.banner_md, "")) for u in got), got  # the job's end was said
    nothing = {comps.banner_md: gr.skip()}
    assert got[0] == nothing and got[-1] == nothing
    assert st.emitting == 0  # every counted update was let go: the next opening does not wait


class CountingClient(AsyncHitlClient):
    """The real client, counting the follower's reads of the job: what gathering progress saves."""

    gets = 0

    async def get_job(self, job_id: str) -> JobSnapshot:
        self.gets += 1
        return await super().get_job(job_id)


def test_a_burst_of_progress_is_read_in_a_few_gets_and_the_end_is_still_shown(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 67)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    opened = cb.open_job(st, job)
    assert cb.on_submit(st, opened[comps.annotator])[comps.banner_md].startswith("Submitted")
    shown = st.version

    async def follow() -> tuple[list[dict[Any, Any]], int, list[Event]]:
        client = CountingClient(api_server.url, TOKENS["rev1"])
        try:
            follower = follow_job(st, job, st.follow_gen, client, cb, threading.Event())
            got = await updates(follower, until=lambda u: False, timeout=60)
            return got, client.gets, [e async for e in client.events(job)]
        finally:
            await client.aclose()

    got, gets, events = asyncio.run(follow())
    assert any("ended" in str(u.get(comps.banner_md, "")) for u in got), got  # the end is shown
    progress = [e for e in events if e.version > shown and e.type in PROGRESS_EVENTS]
    others = [e for e in events if e.version > shown and e.type not in PROGRESS_EVENTS]
    assert len(progress) >= 4, [e.type for e in events]  # two subjects cut: nodes started, segmented, gated
    # One read per event that is not progress at most, and progress read in batches, not one GET each.
    assert 1 <= gets < len(progress) + len(others), (gets, [e.type for e in progress], [e.type for e in others])
    assert gets <= len(others) + len(progress) // 2, (gets, [e.type for e in progress], [e.type for e in others])
