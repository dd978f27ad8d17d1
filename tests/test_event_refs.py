"""Events stored by reference to the job's meta (``statecore.eventrefs``, docs/protocol.md § Redis
layout): a waiting job keeps its ``PAUSE_OPENED`` (``active_pause``, ``box_list``) and its
``JOB_CREATED`` (image size, submitter) as ``"data":"@meta"``, and every reader still gets them
whole, byte for byte the same before and after the pause is consumed, cancelled or superseded,
also when the box list changes afterwards. Real redis-server and Store."""

from __future__ import annotations

import json
from typing import Any

from hitl_review.statecore import keys
from hitl_review.statecore.store import Store

from .helpers import iv, keep, manual, validate, waiting_job


async def _raw(store: Store, job_id: str) -> list[str]:
    return await store.r.lrange(keys.job(job_id).events, 0, -1)


async def _history(store: Store, job_id: str) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json") for e in await store.events_after(job_id)]


def _pause_opened(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in history if e["type"] == "PAUSE_OPENED"]


async def test_a_waiting_job_keeps_its_pause_event_by_reference_and_reads_it_whole(store, image):
    job_id = await waiting_job(store, image, submitter="alice")
    raw = await _raw(store, job_id)
    kinds = [json.loads(x)["type"] for x in raw]
    by_ref = [k for k, x in zip(kinds, raw, strict=True) if x.endswith('"data":"@meta"}')]
    assert by_ref == ["JOB_CREATED", "PAUSE_OPENED"]
    assert await store.r.hget(keys.job(job_id).meta, "pause_event") == str(kinds.index("PAUSE_OPENED") + 1)

    st = await store.get(job_id)
    history = await _history(store, job_id)
    assert history[0]["type"] == "JOB_CREATED"
    assert history[0]["data"] == {"height": 480, "submitter": "alice", "width": 640, "status": "DETECTING"}
    (opened,) = _pause_opened(history)
    assert opened["active_pause"] == st.active_pause.model_dump(mode="json", exclude_none=True)
    assert opened["box_list"] == [b.model_dump(mode="json") for b in st.box_list]
    assert await store.events_after(job_id, 3) == (await store.events_after(job_id))[3:]  # any range


async def test_the_pause_event_stays_what_the_pause_opened_with_after_the_boxes_change(store, image):
    job_id = await waiting_job(store, image)
    st1 = await store.get(job_id)
    waiting_history = await _history(store, job_id)
    moved = {"box_id": st1.box_list[0].box_id, "bbox": [12, 12, 90, 110], "label": "boot"}
    body = json.loads(
        (await store.intervene(job_id, iv(st1, [moved, manual([300, 300, 400, 400], "bad")]), "rev")).body
    )
    (bad,) = body["diff"]["added"]
    # Consumed: the event was written out in full in the same step, the reference is gone.
    assert await store.r.hget(keys.job(job_id).meta, "pause_event") is None
    after = await _history(store, job_id)
    assert after[: len(waiting_history)] == waiting_history
    assert [b["box_id"] for b in _pause_opened(after)[0]["box_list"]] == [b.box_id for b in st1.box_list]
    assert (await store.get(job_id)).box_list[0].label == "boot"

    # Round 2: a second pause, by reference while it waits, whole once it is consumed.
    assert await validate(store, job_id, {bad: False}) == "OK"
    st2 = await store.get(job_id)
    round_two = await _history(store, job_id)
    assert (await _raw(store, job_id))[-1].endswith('"data":"@meta"}')
    assert _pause_opened(round_two)[1]["box_list"] == [b.model_dump(mode="json") for b in st2.box_list]
    assert _pause_opened(round_two)[1]["active_pause"]["box_ids_to_revise"] == [bad]
    await store.intervene(job_id, iv(st2, keep(st2, 0)), "rev")
    final = await _history(store, job_id)
    assert final[: len(round_two)] == round_two
    assert all(not x.endswith('"data":"@meta"}') for x in (await _raw(store, job_id))[1:])


async def test_a_cancelled_pause_keeps_its_event(store, image):
    job_id = await waiting_job(store, image)
    waiting_history = await _history(store, job_id)
    await store.cancel(job_id, "rev")
    after = await _history(store, job_id)
    assert after[: len(waiting_history)] == waiting_history
    assert after[-1]["type"] == "JOB_FINISHED"
    assert await store.r.hget(keys.job(job_id).meta, "pause_event") is None
