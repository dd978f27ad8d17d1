"""The next job fetched ahead (``ui.prefetch``): what N opens is the claim's fresh snapshot, never a
prefetched copy whose pause moved on or that another reviewer claimed meanwhile. First the rule on
snapshots, then the app's callbacks against the control plane (``api_server``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.tokens import TOKENS
from hitl_review.client import HitlClient
from hitl_review.ui.prefetch import Prefetched, prefetch, take, usable
from hitl_review.ui.session import ReviewerState
from tests.test_ui_callbacks import make_callbacks, waiting_job
from tests.ui_fakes import pause, round1, snapshot


def fetched(snap: Any) -> Prefetched:
    return Prefetched(snapshot=snap, image=Path("/x/i.png"), display=Path("/x/d.jpg"))


def test_only_the_very_state_the_claim_answered_is_usable():
    pre = fetched(round1())
    assert usable(pre, round1())
    moved_on = round1().model_copy(update={"version": 4})
    assert not usable(pre, moved_on)  # answered (or re-offered) since: a newer version
    new_pause = round1().model_copy(update={"active_pause": pause("pause_9")})
    assert not usable(pre, new_pause)  # another review round
    assert not usable(pre, round1().model_copy(update={"job_id": "job_2"}))
    no_review = snapshot(status="PROCESSING_APPROVED_SUBJECTS", active=None, actions=[])
    assert not usable(fetched(no_review), no_review)
    assert not usable(None, round1())


def test_take_uses_the_prefetch_up_and_drops_a_stale_one():
    st = ReviewerState(token="t", signed_in=True)
    st.prefetched = fetched(round1())
    assert take(st, round1().model_copy(update={"version": 4})) is None and st.prefetched is None
    st.prefetched = fetched(round1())
    assert take(st, round1()) is not None and st.prefetched is None  # used once


def test_n_never_shows_a_prefetched_job_stale(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 51)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    with HitlClient(api_server.url, TOKENS["rev1"]) as rev1, HitlClient(api_server.url, TOKENS["rev2"]) as rev2:
        # The prefetch makes the job's image and display copy local, and keeps its snapshot.
        snap = rev1.get_job(job)
        pre = prefetch(st, rev1, cb.store, exclude=[])
        assert pre is not None and st.prefetched is pre and pre.image.exists() and pre.display.exists()
        # (whichever job the shared queue had first; this job from now on)
        st.prefetched = Prefetched(snapshot=snap, image=pre.image, display=pre.display)

        # Another reviewer claims it: N passes it over, and the prefetched copy is not shown.
        rev2.claim(job)
        cb.on_next(st)
        assert st.job_id != job and st.prefetched is None
        cb.release_claim(st)  # what N opened (another test's job on the shared server) is not kept

        # Its pause answered meanwhile: opening it shows the job as it is now, not the prefetched pause.
        st.prefetched = Prefetched(snapshot=snap, image=pre.image, display=pre.display)
        assert snap.active_pause is not None
        rev2.intervene(
            job,
            intervention_id="iv_prefetch_1",
            pause_token=snap.active_pause.pause_token,
            base_version=snap.version,
            subjects=[],
        )
        out = cb.open_job(st, job)
        assert st.prefetched is None and st.snapshot is not None and st.snapshot.version > snap.version
        assert st.panel is None and snap.active_pause.pause_token not in str(out.get(comps.stage_md, ""))
