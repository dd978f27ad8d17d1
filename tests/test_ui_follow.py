"""What a follower says after this reviewer's own submission, against a real API (the uvicorn harness, a
real redis-server): the job's progress to its end, never the review again, never a blanked confirmation,
and never "Another reviewer submitted first." about the submission itself (``ReviewerState.sending``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from harness.tokens import TOKENS
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
    assert not any(visible(u[comps.review_col]) for u in got if comps.review_col in u)
    banners = [u[comps.banner_md] for u in got if comps.banner_md in u]
    assert "" not in banners and "Another reviewer submitted first." not in banners, banners
