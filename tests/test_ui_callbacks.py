"""The reviewer app's callbacks, called with their components and no browser: first without a server,
then against the control plane (``api_server``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image

from harness.tokens import TOKENS
from hitl_review.client import HitlClient, new_intervention_id
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.ui.annotator import (
    AUTO_TARGET,
    edits_between,
    read_annotator,
)
from hitl_review.ui.callbacks import THUMBS_PER_TICK, Callbacks, show
from hitl_review.ui.images import ImageStore
from hitl_review.ui.layout import Components, layout
from hitl_review.ui.panel import (
    ROUND1_TEXT,
)
from hitl_review.ui.session import ReviewerState
from hitl_review.ui.shown import is_shown
from tests.ui_fakes import (
    IMAGE,
    H,
    W,
    as_raw,
    drawn,
    opened,
    round1,
    shown,
)

# --------------------------------------------------------------------------- callbacks, no browser


def make_callbacks(api_url: str, root: Path) -> tuple[Components, Callbacks]:
    """The page's components and handlers, as ``build_app`` makes them, without serving anything."""
    with gr.Blocks():
        comps = layout(token=None, require_login=False)
    return comps, Callbacks(comps, api_url, ImageStore(root))


def visible(update: Any) -> bool:
    """Shown by an update: a container's style element (ui.shown) that does not hide it, or its ``visible``."""
    if isinstance(update, str):
        return is_shown(update)
    return bool(update["visible"])


def test_callbacks_draw_label_and_refuse_an_unlabelled_box_without_a_server(tmp_path: Path) -> None:
    comps, cb = make_callbacks("http://127.0.0.1:9", tmp_path / "ui")
    st = opened(round1())
    cb.store.image_dir.mkdir(parents=True)
    Image.new("RGB", (W, H), (250, 250, 250)).save(cb.store.image_dir / f"{IMAGE.sha256}.png")
    assert cb.store.ensure(st, cb.clients.get(st.token)) == st.image_path  # already here: no download

    out = cb.view(st, redraw=True, banner="", error="")
    assert "Confirm the detected subjects" in out[comps.stage_md] and "pause_1" in out[comps.stage_md]
    assert visible(out[comps.review_col.style]) and visible(out[comps.cancel_btn])
    assert not visible(out[comps.results_col.style]) and not visible(out[comps.reapply_btn])
    value = out[comps.annotator]
    # the canvas' display copy (a JPEG, ui.images), named after the pause it shows
    assert Path(value["image"]).name == f"{IMAGE.sha256}__pause_1.jpg" and Path(value["image"]).exists()
    assert "#1 shoe" in out[comps.notes_md] and out[comps.current_job] == "job_1"

    raw = as_raw(value)
    raw["boxes"].insert(0, drawn(300, 200, 350, 260))
    out = cb.on_annotator_change(st, raw, AUTO_TARGET)
    assert "1 new box still needs a label" in out[comps.notes_md]
    assert ("New box 1: (no label)", "new:1") in out[comps.label_target]["choices"]
    out = cb.on_submit(st, raw)
    assert "needs a label" in out[comps.review_error] and st.intervention_id is None  # nothing was sent

    out = cb.on_apply_label(st, raw, AUTO_TARGET, "cap")
    assert out[comps.annotator]["boxes"][0]["label"] == "new: cap" and out[comps.label_text] == ""
    assert cb.on_apply_label(st, raw, AUTO_TARGET, " ")[comps.review_error] == "Type a label first."

    # a 409 offers the edits again; re-applying puts them on the canvas of the new panel
    edits = edits_between(shown(st.panel), read_annotator(shown(st.panel), as_raw(out[comps.annotator])))
    st.record_conflict("VERSION_CONFLICT", round1().model_copy(update={"version": 4}), edits)
    out = cb.view(st, redraw=True)
    assert visible(out[comps.reapply_btn])
    out = cb.on_reapply(st)
    assert out[comps.annotator]["boxes"][0]["label"] == "new: cap" and not visible(out[comps.reapply_btn])
    assert out[comps.banner_md].startswith("Your edits were re-applied")


def test_callbacks_with_nothing_open(tmp_path: Path) -> None:
    comps, cb = make_callbacks("http://127.0.0.1:9", tmp_path / "ui")
    st = ReviewerState(token="t", signed_in=True)
    assert cb.on_submit(st, None)[comps.banner_md] == "Nothing is waiting for review on this job."
    assert comps.banner_md in cb.on_cancel(st)  # skipped: no job to cancel
    assert cb.open_job(st, "  ")[comps.banner_md] == "No job id."
    assert cb.on_tick(ReviewerState())[comps.queue_note] is not None  # not signed in: the queue is skipped
    out = cb.view(st)
    assert out[comps.job_md].startswith("No job open") and not visible(out[comps.review_col.style])
    assert is_shown(show((comps.cut_confirm, True))()[comps.cut_confirm.style])


# --------------------------------------------------------------------------- callbacks against the control plane


async def updates(
    follower: AsyncGenerator[dict[Any, Any], None], until: Callable[[dict[Any, Any]], bool], timeout: float = 60
) -> list[dict[Any, Any]]:
    """What a follower yields, up to the first update ``until`` accepts (or its end)."""
    out: list[dict[Any, Any]] = []
    async with contextlib.aclosing(follower), asyncio.timeout(timeout):
        async for u in follower:
            out.append(u)
            if until(u):
                break
    return out


def waiting_job(api_url: str, seed: int) -> str:
    with HitlClient(api_url, TOKENS["sub1"]) as sub:
        job = sub.submit(product_composite(seed, 320, 240, n=2)[0]).job_id
        sub.wait_for(job, ["WAITING_USER_SELECTION"], timeout=60)
    return job


def test_callbacks_open_submit_and_follow_the_job_to_its_results(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 31)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)

    queue = cb.on_tick(st)
    assert job in list(queue[comps.queue_table]["Job"]) and "waiting" in queue[comps.queue_note]
    # The session's server may hold older waiting jobs of other tests (this job's own row), more than
    # one tick's thumbnails: each tick makes the next THUMBS_PER_TICK missing ones.
    ticks = 1
    while True:
        at = list(queue[comps.queue_table]["Job"]).index(job)
        row = list(queue[comps.queue_table].iloc[at])
        made = sum(str(c).startswith("![") for c in queue[comps.queue_table]["Image"])
        if str(row[0]) or made < ticks * THUMBS_PER_TICK:
            break
        queue, ticks = cb.on_tick(st), ticks + 1
    assert row[1] == job and row[2] == "Confirm boxes (round 1)"  # a thumbnail first, the stage in words
    assert str(row[0]).startswith(f"![{job}](/gradio_api/file=")  # made once the rows above it had theirs
    # a click on the thumbnail opens the row's job as a click on its id does
    out = cb.on_queue_select(st, gr.SelectData(None, {"index": [at, 0], "value": row[0], "row_value": row}))
    assert job in out[comps.job_md] and visible(out[comps.review_col.style])
    assert ROUND1_TEXT in out[comps.stage_md]
    assert Path(st.image_path or "").exists()

    drawn = out[comps.annotator]  # drawn in the click's own step (ui.app.wire)
    assert len(drawn["boxes"]) == 2 and cb.after_open(st) == {comps.banner_md: gr.skip()}  # nothing left to draw
    out = cb.on_submit(st, drawn)  # every detected box, as shown
    assert out[comps.banner_md].startswith("Submitted — kept 2, added 0, deleted 0.")
    assert not visible(next(cb.after_submit(st))[comps.review_col.style])  # the event after the answer closes it

    done = asyncio.run(updates(cb.follow(st, None), until=lambda u: comps.results_md in u))  # type: ignore[arg-type]  # no gr.Request off a browser
    last = done[-1]
    assert last[comps.banner_md] == "The job ended: SUCCEEDED." and "SUCCEEDED" in last[comps.status_md]
    assert "2 of 2 subjects cut out" in last[comps.results_md] and len(last[comps.results_gallery]) == 2
    assert not visible(last[comps.cancel_btn])


def test_follower_tells_when_another_reviewer_submits_first(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 32)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    assert visible(cb.open_job(st, job)[comps.review_col.style])
    pause = st.panel
    assert pause is not None

    def other_reviewer_cuts_nothing() -> None:
        with HitlClient(api_server.url, TOKENS["rev2"]) as rev2:
            rev2.intervene(
                job,
                intervention_id=new_intervention_id(),
                pause_token=pause.pause_token,
                base_version=pause.base_version,
                subjects=[],
            )

    timer = threading.Timer(1.5, other_reviewer_cuts_nothing)  # while the follower streams
    timer.start()
    try:
        got = asyncio.run(updates(cb.follow(st, None), until=lambda u: False))  # type: ignore[arg-type]  # no gr.Request off a browser
    finally:
        timer.cancel()
    told = [i for i, u in enumerate(got) if u.get(comps.banner_md) == "Another reviewer submitted first."]
    assert told, f"the follower did not tell: {got}"
    assert not visible(got[told[0]][comps.review_col.style])
    assert all(visible(u[comps.review_col.style]) for u in got[: told[0]])  # before it, nothing closed the review
    assert "EMPTY_SELECTION" in got[-1][comps.status_md] and "chose to cut nothing" in got[-1][comps.results_md]
    # one follower per opened job: a second call for the same opening returns at once
    assert asyncio.run(updates(cb.follow(st, None), until=lambda u: False, timeout=5)) == []  # type: ignore[arg-type]  # no gr.Request off a browser


def test_closing_the_tab_stops_its_followers(api_server: Any, tmp_path: Path) -> None:
    comps, cb = make_callbacks(api_server.url, tmp_path / "ui")
    job = waiting_job(api_server.url, 33)
    st = ReviewerState(token=TOKENS["rev1"], signed_in=True)
    cb.open_job(st, job)
    tab = gr.Request(session_hash="tab-1")

    async def follow_then_close() -> list[dict[Any, Any]]:
        follower = asyncio.ensure_future(updates(cb.follow(st, tab), until=lambda u: False, timeout=30))
        await asyncio.sleep(1.0)
        cb.on_unload(tab)
        return await follower

    assert asyncio.run(follow_then_close()) == []  # ended by the unload, well before its timeout
    with HitlClient(api_server.url, TOKENS["admin"]) as admin:
        admin.cancel(job)
