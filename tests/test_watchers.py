"""Who watches a waiting job, whichever replica streams it (statecore.watchers; seed 000: alert on a
pause's age and on whether anyone still follows the job). ``hitl_sse_streams`` used to be counted in
the Events replica and rendered by the Api process: always 0 under Serve."""

from __future__ import annotations

import asyncio
import time

from prometheus_client.parser import text_string_to_metric_families

from hitl_review.serve_app.observability import metrics
from hitl_review.serve_app.routes.events import EventHub
from hitl_review.statecore import watchers

from .helpers import waiting_job


async def test_a_streamed_job_is_watched_and_an_unstreamed_one_is_not(store, image):
    followed = await waiting_job(store, image)
    alone = await waiting_job(store, image)
    hub = EventHub(store)

    async def follow() -> None:
        async for _ev in hub.stream(followed, 0):
            pass

    task = asyncio.create_task(follow())
    try:
        deadline = time.monotonic() + 10
        while (w := await watchers.read(store.r)).streams != 1:
            assert time.monotonic() < deadline, w
            await asyncio.sleep(0.05)
        assert w.waiting_unwatched == 1  # ``alone``
        later = int(time.time() * 1000) + 5_000
        assert (await watchers.read(store.r, now_ms=later)).oldest_unwatched_pause_age_s >= 5
        # Rendered by any process's /metrics from Redis, not from the hub's own process.
        await metrics.refresh_stuck(store.r, 3600)
        got = {
            s.name: s.value
            for f in text_string_to_metric_families(metrics.render().decode())
            for s in f.samples
            if s.name in ("hitl_sse_streams", "hitl_waiting_unwatched")
        }
        assert got == {"hitl_sse_streams": 1, "hitl_waiting_unwatched": 1}
    finally:
        task.cancel()
        for t in hub._tasks:
            t.cancel()
    # The hub is gone: past the watch TTL its job counts as unwatched, and its streams no longer count.
    expired = int(time.time() * 1000) + int((watchers.WATCH_TTL_S + 3 * watchers.BEACON_S) * 1000)
    gone = await watchers.read(store.r, now_ms=expired)
    assert (gone.streams, gone.waiting_unwatched) == (0, 2)
    assert alone != followed
