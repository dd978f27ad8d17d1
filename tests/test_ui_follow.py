"""The follower says its job's view again early on (``ui.pump.REASSERT_AFTER_S``), against a real API
(the uvicorn harness, a real redis-server): the previous job's follower can deliver that job's end after
the next job was opened, and the page then showed the ended job while the session held the new one
(claimed, renewed, passed over by N: the reviewer benchmark's four-reviewer stall, issue 22)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from harness.tokens import TOKENS
from hitl_review.ui.pump import REASSERT_AFTER_S
from hitl_review.ui.session import ReviewerState

from .test_ui_callbacks import make_callbacks, updates, visible, waiting_job


def test_the_follower_says_the_open_jobs_view_again_and_leaves_the_canvas_alone(
    api_server: Any, tmp_path: Path
) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 66)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    opened = cb.open_job(st, job)
    assert visible(opened[comps.review_col]) and opened[comps.annotator]["boxes"]

    # What a late update of the previous job would have left on the page does not matter here: the
    # follower's own output is what puts this job back.
    t0 = time.monotonic()
    follower = cb.follow(st, None)  # type: ignore[arg-type]  # no gr.Request off a browser
    got = asyncio.run(updates(follower, until=lambda u: comps.job_md in u, timeout=30))
    said = got[-1]
    assert time.monotonic() - t0 >= REASSERT_AFTER_S[0] - 0.1
    assert job in said[comps.job_md] and visible(said[comps.review_col]) and visible(said[comps.canvas_col])
    assert said[comps.banner_md] == "" and comps.annotator not in said  # the canvas (and the reviewer's edits) kept
    assert st.job_id == job and st.reviewing


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
    assert not any(visible(u[comps.review_col]) for u in got if comps.review_col in u)
    banners = [u[comps.banner_md] for u in got if comps.banner_md in u]
    assert "" not in banners, banners  # the confirmation is never blanked
