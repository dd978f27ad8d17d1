"""Rebase help (docs/protocol.md § Rebase help) against a real redis-server: every 409 of the
intervention route carries ``rebase``, the box-level change between the box list the reviewer was
shown at its ``base_version`` and the job's box list now, matched by ``box_id``."""

from __future__ import annotations

import uuid

import pytest

from harness.tokens import auth
from hitl_review.statecore.errors import Conflict, VersionConflict
from hitl_review.statecore.models import Box
from hitl_review.statecore.rebase import box_changes
from hitl_review.statecore.store import StoreConfig

from .asgi_util import asgi_client
from .helpers import iv, keep, manual, validate, waiting_job


def box(box_id: str, bbox=(0, 0, 10, 10), label: str | None = "shoe", source: str = "model") -> Box:
    return Box(box_id=box_id, bbox=bbox, label=label, score=None, source=source)


def test_box_changes_added_removed_moved_relabelled():
    base = [box("a"), box("b"), box("c", label="hand"), box("d", bbox=(5, 5, 20, 20), label="bag")]
    now = [
        box("a"),
        box("b", bbox=(1, 0, 10, 10)),
        box("c", label="glove"),
        box("d", bbox=(6, 5, 20, 20), label="tote"),
    ]
    now.append(box("e", source="manual"))
    ch = box_changes(base, now)
    assert [b["box_id"] for b in ch["added"]] == ["e"] and ch["added"][0]["source"] == "manual"
    assert ch["removed"] == []
    assert ch["moved"] == [
        {"box_id": "b", "from": [0, 0, 10, 10], "to": [1, 0, 10, 10]},
        {"box_id": "d", "from": [5, 5, 20, 20], "to": [6, 5, 20, 20]},
    ]
    assert ch["relabelled"] == [
        {"box_id": "c", "from": "hand", "to": "glove"},
        {"box_id": "d", "from": "bag", "to": "tote"},
    ]
    gone = box_changes(base, base[1:])
    assert [b["box_id"] for b in gone["removed"]] == ["a"] and not gone["added"] and not gone["moved"]
    assert box_changes(base, base) == {"added": [], "removed": [], "moved": [], "relabelled": []}


async def test_a_stale_tab_gets_what_the_other_reviewer_changed(store, image):
    job_id = await waiting_job(store, image)
    seen = await store.get(job_id)  # both reviewers open the same pause
    b0, b1, b2 = seen.box_list
    first = [
        {"box_id": b1.box_id, "bbox": [210, 40, 330, 200]},
        {"box_id": b2.box_id, "bbox": list(b2.bbox), "label": "glove"},
        manual([500, 300, 600, 400], "bag"),
    ]
    assert (await store.intervene(job_id, iv(seen, first), "rev1")).status_code == 200
    with pytest.raises(VersionConflict) as ei:
        await store.intervene(job_id, iv(seen, keep(seen, 0, 1, 2)), "rev2")
    rebase = ei.value.to_body()["rebase"]
    assert rebase["base_version"] == seen.version and rebase["version"] == seen.version + 1
    assert rebase["base_found"] is True and rebase["base_pause_token"] == seen.active_pause.pause_token
    assert [b["box_id"] for b in rebase["removed"]] == [b0.box_id]
    assert rebase["removed"][0]["bbox"] == list(b0.bbox)
    assert len(rebase["added"]) == 1 and rebase["added"][0]["source"] == "manual"
    assert rebase["added"][0]["bbox"] == [500, 300, 600, 400] and rebase["added"][0]["label"] == "bag"
    assert rebase["moved"] == [{"box_id": b1.box_id, "from": list(b1.bbox), "to": [210, 40, 330, 200]}]
    assert rebase["relabelled"] == [{"box_id": b2.box_id, "from": b2.label, "to": "glove"}]
    # It compares with the snapshot the same 409 carries.
    assert {b["box_id"] for b in ei.value.snapshot["box_list"]} == {b1.box_id, b2.box_id, rebase["added"][0]["box_id"]}


async def test_the_base_is_the_pause_the_reviewer_was_shown_in_round_two(store, image):
    job_id = await waiting_job(store, image)
    r1 = await store.get(job_id)
    first = keep(r1, 0) + [manual([300, 300, 400, 400], "cup")]
    assert (await store.intervene(job_id, iv(r1, first), "rev1")).status_code == 200
    drawn = [b.box_id for b in (await store.get(job_id)).box_list if b.source == "manual"]
    assert await validate(store, job_id, {drawn[0]: False}) == "OK"
    r2 = await store.get(job_id)
    assert r2.round == 2 and r2.active_pause is not None
    # A tab still showing round 1 submits against round 1's pause.
    with pytest.raises(VersionConflict) as ei:
        await store.intervene(job_id, iv(r1, keep(r1, 0, 1)), "rev2")
    rebase = ei.value.to_body()["rebase"]
    assert rebase["base_pause_token"] == r1.active_pause.pause_token and rebase["version"] == r2.version
    assert {b["box_id"] for b in rebase["removed"]} == {r1.box_list[1].box_id, r1.box_list[2].box_id}
    assert [b["box_id"] for b in rebase["added"]] == drawn
    # A submission against round 2's own pause (wrong token) compares round 2 with itself: no change.
    with pytest.raises(Conflict) as same:
        await store.intervene(job_id, iv(r2, keep(r2, 0), pause_token="pause_stale"), "rev2")
    assert same.value.code == "PAUSE_TOKEN_MISMATCH"
    assert same.value.to_body()["rebase"]["base_pause_token"] == r2.active_pause.pause_token
    assert all(same.value.to_body()["rebase"][k] == [] for k in ("added", "removed", "moved", "relabelled"))


async def test_a_base_version_with_no_pause_at_or_before_it_says_so(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    for base_version in (st.version + 5, 0):
        with pytest.raises(VersionConflict) as ei:
            await store.intervene(job_id, iv(st, keep(st, 0), base_version=base_version), "rev1")
        rebase = ei.value.to_body()["rebase"]
        assert rebase["base_found"] is False and rebase["base_pause_token"] is None
        assert rebase["base_version"] == base_version and rebase["version"] == st.version
        assert rebase["added"] == rebase["removed"] == rebase["moved"] == rebase["relabelled"] == []


# ----------------------------------------------------------------------------- on every 409 code of the route

CODES = [
    "IDEMPOTENCY_CONFLICT",
    "JOB_CANCELLED",
    "VERSION_CONFLICT",
    "PAUSE_NOT_ACTIVE",
    "PAUSE_TOKEN_MISMATCH",
    "SNAPSHOT_MISMATCH",
    "WORKFLOW_VERSION_INCOMPATIBLE",
]


@pytest.mark.parametrize("code", CODES)
async def test_every_409_of_the_intervention_route_carries_rebase(store, redis_server, tmp_path, image, code):
    config = StoreConfig(retention_s=3600)
    if code == "WORKFLOW_VERSION_INCOMPATIBLE":  # an app that cannot continue this build's pauses
        config = StoreConfig(
            retention_s=3600, workflow_version="v-next", continuable_workflow_versions=frozenset({"v-next"})
        )
    job_id = await waiting_job(store, image)
    async with asgi_client(redis_server.url, tmp_path, config) as api:
        url = f"/api/v1/jobs/{job_id}/interventions"
        snap = (await api.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1"))).json()
        pause = snap["active_pause"]
        b0 = snap["box_list"][0]
        body = {
            "intervention_id": f"iv_{uuid.uuid4().hex[:12]}",
            "pause_token": pause["pause_token"],
            "base_version": snap["version"],
            "subjects": [{"box_id": b0["box_id"], "bbox": b0["bbox"]}],
        }
        if code == "IDEMPOTENCY_CONFLICT":
            assert (await api.post(url, json=body, headers=auth("rev1"))).status_code == 200
            body["subjects"] = []
        elif code == "JOB_CANCELLED":
            await store.cancel(job_id, "rev2")
        elif code == "VERSION_CONFLICT":
            other = dict(body, intervention_id="iv_other", subjects=[])
            assert (await api.post(url, json=other, headers=auth("rev2"))).status_code == 200
        elif code == "PAUSE_NOT_ACTIVE":
            assert (
                await api.post(url, json=dict(body, intervention_id="iv_first"), headers=auth("rev2"))
            ).status_code == 200
            body["base_version"] = snap["version"] + 1
        elif code == "PAUSE_TOKEN_MISMATCH":
            body["pause_token"] = "pause_someone_elses"
        elif code == "SNAPSHOT_MISMATCH":
            body["snapshot_id"] = "snap_" + "f" * 20
        r = await api.post(url, json=body, headers=auth("rev1"))
    assert r.status_code == 409, r.text
    out = r.json()
    assert out["code"] == code
    assert out["snapshot"]["job_id"] == job_id and "claim" in out["snapshot"]
    rebase = out["rebase"]
    assert set(rebase) == {
        "base_version",
        "version",
        "base_found",
        "base_pause_token",
        "added",
        "removed",
        "moved",
        "relabelled",
    }
    assert rebase["base_version"] == body["base_version"] and rebase["version"] == out["snapshot"]["version"]
    if code in ("IDEMPOTENCY_CONFLICT", "VERSION_CONFLICT", "PAUSE_NOT_ACTIVE"):
        # someone else's submission kept only b0 (or nothing): the other boxes are gone
        removed = {b["box_id"] for b in rebase["removed"]}
        assert removed >= {b["box_id"] for b in snap["box_list"][1:]}
