"""Snapshot echo and the fifth gate (docs/protocol.md § Snapshot echo and the fifth gate) against a
real redis-server: ``SNAPSHOT_MISMATCH`` after the pause token, and a pause opened under a workflow
definition this build cannot continue re-offered under the current one (new pause, new token, the
old token refused), never silently continued."""

from __future__ import annotations

import json

import pytest

from harness.tokens import auth
from hitl_review.statecore import keys
from hitl_review.statecore.errors import (
    InvalidRequest,
    PauseTokenMismatch,
    SnapshotMismatch,
    VersionConflict,
    WorkflowVersionIncompatible,
)
from hitl_review.statecore.models import InterventionRequest
from hitl_review.statecore.plan import CONTINUABLE_WORKFLOW_VERSIONS, WORKFLOW_VERSION
from hitl_review.statecore.store import Store, StoreConfig

from .asgi_util import asgi_client
from .helpers import footprint, iv, keep, manual, waiting_job

OTHER = "snap_" + "0" * 20
NEXT_VERSION = "cutout-v2-test"  # a definition this build does not know


@pytest.fixture
async def next_build(redis_server):
    """A store as a build running NEXT_VERSION that cannot continue this build's pauses would be."""
    s = Store.from_url(
        redis_server.url,
        StoreConfig(
            retention_s=3600, workflow_version=NEXT_VERSION, continuable_workflow_versions=frozenset({NEXT_VERSION})
        ),
    )
    yield s
    await s.close()


def test_the_build_names_its_workflow_version_and_what_it_continues():
    assert WORKFLOW_VERSION in CONTINUABLE_WORKFLOW_VERSIONS
    assert NEXT_VERSION not in CONTINUABLE_WORKFLOW_VERSIONS
    # A store that could not continue its own pauses would re-offer them for ever.
    with pytest.raises(ValueError, match="continuable"):
        StoreConfig(workflow_version=NEXT_VERSION)


async def test_every_pause_records_its_workflow_version(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    assert st.active_pause is not None and st.active_pause.workflow_version == WORKFLOW_VERSION
    events = [e for e in await store.events_after(job_id) if e.type == "PAUSE_OPENED"]
    assert events[-1].data["active_pause"]["workflow_version"] == WORKFLOW_VERSION


# ----------------------------------------------------------------------------- SNAPSHOT_MISMATCH


async def test_a_snapshot_id_that_is_not_the_pauses_is_409_and_writes_nothing(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    before = await footprint(store, job_id)
    with pytest.raises(SnapshotMismatch) as ei:
        await store.intervene(job_id, iv(st, keep(st, 0), iid="iv_snap", snapshot_id=OTHER), "rev1")
    body = ei.value.to_body()
    assert ei.value.status == 409 and body["code"] == "SNAPSHOT_MISMATCH"
    assert body["snapshot"]["active_pause"]["snapshot_id"] == st.active_pause.snapshot_id
    assert body["snapshot"]["version"] == st.version and "rebase" in body
    assert await footprint(store, job_id) == before
    # The same intervention id with the pause's own snapshot id is accepted: nothing was recorded.
    ok = await store.intervene(
        job_id, iv(st, keep(st, 0), iid="iv_snap", snapshot_id=st.active_pause.snapshot_id), "rev1"
    )
    assert ok.status_code == 200 and not ok.replayed


async def test_the_snapshot_gate_comes_after_version_pause_and_token_and_before_box_checks(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    with pytest.raises(VersionConflict):
        await store.intervene(job_id, iv(st, keep(st, 0), base_version=st.version - 1, snapshot_id=OTHER), "rev1")
    with pytest.raises(PauseTokenMismatch):
        await store.intervene(job_id, iv(st, keep(st, 0), pause_token="pause_other", snapshot_id=OTHER), "rev1")
    unknown_box = [{"box_id": "box_missing", "bbox": [1, 1, 5, 5]}]
    with pytest.raises(SnapshotMismatch):
        await store.intervene(job_id, iv(st, unknown_box, snapshot_id=OTHER), "rev1")
    with pytest.raises(InvalidRequest):
        await store.intervene(job_id, iv(st, unknown_box, snapshot_id=st.active_pause.snapshot_id), "rev1")


async def test_an_absent_or_null_snapshot_id_is_not_checked_and_replays_alike(store, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    first = await store.intervene(job_id, iv(st, keep(st, 0, 2), iid="iv_plain"), "rev1")
    assert first.status_code == 200
    explicit_null = iv(st, keep(st, 0, 2), iid="iv_plain", snapshot_id=None)
    again = await store.intervene(job_id, explicit_null, "rev1")
    assert again.replayed and again.body == first.body
    # The idempotency hash of a body without snapshot_id is what it was before the field existed.
    assert "snapshot_id" not in explicit_null.hashed_body()
    with_it = iv(st, keep(st, 0), snapshot_id=st.active_pause.snapshot_id)
    assert with_it.hashed_body()["snapshot_id"] == st.active_pause.snapshot_id


@pytest.mark.parametrize("value", ["snap_1", "snap_" + "G" * 20, "pause_" + "0" * 20, "snap_" + "0" * 21, 7, ""])
async def test_a_malformed_snapshot_id_is_400_and_the_job_unchanged(store, redis_server, tmp_path, image, value):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    before = await footprint(store, job_id)
    body = {
        "intervention_id": "iv_malformed",
        "pause_token": st.active_pause.pause_token,
        "base_version": st.version,
        "subjects": keep(st, 0),
        "snapshot_id": value,
    }
    async with asgi_client(redis_server.url, tmp_path) as api:
        r = await api.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=auth("rev1"))
    assert r.status_code == 400 and r.json()["code"] == "INVALID_REQUEST", r.text
    assert "snapshot_id" in r.json()["message"]
    assert await footprint(store, job_id) == before


async def test_the_snapshot_id_echoed_over_http(store, redis_server, tmp_path, image):
    job_id = await waiting_job(store, image)
    async with asgi_client(redis_server.url, tmp_path) as api:
        snap = (await api.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1"))).json()
        body = {
            "intervention_id": "iv_echo",
            "pause_token": snap["active_pause"]["pause_token"],
            "base_version": snap["version"],
            "subjects": [],
            "snapshot_id": OTHER,
        }
        url = f"/api/v1/jobs/{job_id}/interventions"
        r = await api.post(url, json=body, headers=auth("rev1"))
        assert r.status_code == 409 and r.json()["code"] == "SNAPSHOT_MISMATCH"
        assert r.json()["snapshot"]["claim"] is None and "rebase" in r.json()
        body["snapshot_id"] = snap["active_pause"]["snapshot_id"]
        ok = await api.post(url, json=body, headers=auth("rev1"))
        assert ok.status_code == 200 and ok.json()["status"] == "EMPTY_SELECTION"


# ----------------------------------------------------------------------------- WORKFLOW_VERSION_INCOMPATIBLE


async def test_a_pause_of_an_incompatible_workflow_is_reoffered_never_continued(store, next_build, image):
    job_id = await waiting_job(store, image)  # opened by this build
    st = await store.get(job_id)
    old = st.active_pause
    assert old is not None and old.workflow_version not in next_build.config.continuable_workflow_versions
    outbox_before = sum([await store.r.xlen(s) for s in keys.job(job_id).outboxes])

    req = iv(st, keep(st, 0, 1), iid="iv_old_def", snapshot_id=old.snapshot_id)
    with pytest.raises(WorkflowVersionIncompatible) as ei:
        await next_build.intervene(job_id, req, "rev1")
    body = ei.value.to_body()
    assert ei.value.status == 409 and body["code"] == "WORKFLOW_VERSION_INCOMPATIBLE"
    snap = body["snapshot"]
    new = snap["active_pause"]
    # Re-offered: a new pause at the same stage and round, a new token, under the current definition.
    assert snap["version"] == st.version + 1 and snap["status"] == st.status.value
    assert new["status"] == "WAITING" and new["pause_token"] != old.pause_token
    assert new["stage"] == old.stage and new["round"] == old.round and new["base_version"] == st.version + 1
    assert new["workflow_version"] == NEXT_VERSION and new["snapshot_id"] != old.snapshot_id
    assert snap["box_list"] == [b.model_dump(mode="json") for b in st.box_list]
    assert "rebase" in body
    # Never continued: nothing consumed, no node queued, the intervention id not recorded.
    assert sum([await store.r.xlen(s) for s in keys.job(job_id).outboxes]) == outbox_before
    assert await store.r.hget(keys.job(job_id).idem, "iv_old_def") is None
    history = {p.pause_token: p for p in await store.pause_history(job_id)}
    assert history[old.pause_token].status == "CANCELLED" and history[old.pause_token].consumed_by is None
    types = [e.type for e in await store.events_after(job_id)]
    assert types[-2:] == ["PAUSE_SUPERSEDED", "PAUSE_OPENED"] and "INTERVENTION_ACCEPTED" not in types
    superseded = [e for e in await store.events_after(job_id) if e.type == "PAUSE_SUPERSEDED"][0]
    assert superseded.data["pause_token"] == old.pause_token
    assert superseded.data["workflow_version"] == WORKFLOW_VERSION
    # The job keeps its place in the review queue.
    assert await store.r.zscore(keys.job(job_id).waiting, job_id) is not None

    # The old token is refused from now on: as sent (stale version), and even on the new version.
    with pytest.raises(VersionConflict):
        await next_build.intervene(job_id, iv(st, keep(st, 0, 1)), "rev1")
    now = await next_build.get(job_id)
    with pytest.raises(PauseTokenMismatch):
        await next_build.intervene(job_id, iv(now, keep(now, 0, 1), pause_token=old.pause_token), "rev1")
    # The re-offered pause is reviewed under the current definition and consumed as usual.
    ok = await next_build.intervene(
        job_id, iv(now, keep(now, 0, 1), iid="iv_old_def", snapshot_id=new["snapshot_id"]), "rev1"
    )
    assert ok.status_code == 200 and json.loads(ok.body)["version"] == st.version + 2


async def test_a_build_that_can_continue_the_old_version_continues_it(store, redis_server, image):
    both = Store.from_url(
        redis_server.url,
        StoreConfig(
            retention_s=3600,
            workflow_version=NEXT_VERSION,
            continuable_workflow_versions=frozenset({WORKFLOW_VERSION, NEXT_VERSION}),
        ),
    )
    try:
        job_id = await waiting_job(store, image)
        st = await store.get(job_id)
        reply = await both.intervene(job_id, iv(st, keep(st, 0) + [manual([300, 300, 400, 400])]), "rev1")
        assert reply.status_code == 200
        assert (await both.get(job_id)).status.value == "VALIDATING_MANUAL_BOXES"
    finally:
        await both.close()


async def test_the_snapshot_mismatch_is_told_before_a_reoffer(store, next_build, image):
    job_id = await waiting_job(store, image)
    st = await store.get(job_id)
    before = await footprint(store, job_id)
    with pytest.raises(SnapshotMismatch):
        await next_build.intervene(job_id, iv(st, keep(st, 0), snapshot_id=OTHER), "rev1")
    assert await footprint(store, job_id) == before


async def test_pauses_opened_by_a_build_record_its_version(next_build, store, image):
    job_id = await waiting_job(next_build, image)
    st = await next_build.get(job_id)
    assert st.active_pause is not None and st.active_pause.workflow_version == NEXT_VERSION
    # ... and this build, which cannot continue it, re-offers it under its own.
    with pytest.raises(WorkflowVersionIncompatible) as ei:
        await store.intervene(job_id, iv(st, keep(st, 0)), "rev1")
    assert ei.value.snapshot["active_pause"]["workflow_version"] == WORKFLOW_VERSION


def test_snapshot_id_is_optional_in_the_request_model():
    base = {"intervention_id": "iv_1", "pause_token": "pause_x", "base_version": 2, "subjects": []}
    assert InterventionRequest(**base).snapshot_id is None
    assert InterventionRequest(**base, snapshot_id=OTHER).snapshot_id == OTHER


@pytest.mark.cluster
async def test_the_reoffer_and_the_rebase_on_a_redis_cluster(cluster_store, redis_cluster, image):
    next_on_cluster = Store.from_url(
        redis_cluster.url,
        StoreConfig(
            retention_s=3600, workflow_version=NEXT_VERSION, continuable_workflow_versions=frozenset({NEXT_VERSION})
        ),
        cluster=True,
    )
    try:
        job_id = await waiting_job(cluster_store, image)
        st = await cluster_store.get(job_id)
        with pytest.raises(SnapshotMismatch):
            await next_on_cluster.intervene(job_id, iv(st, keep(st, 0), snapshot_id=OTHER), "rev1")
        with pytest.raises(WorkflowVersionIncompatible) as ei:
            await next_on_cluster.intervene(job_id, iv(st, keep(st, 0)), "rev1")
        new = ei.value.snapshot["active_pause"]
        assert new["workflow_version"] == NEXT_VERSION and new["pause_token"] != st.active_pause.pause_token
        rebase = ei.value.to_body()["rebase"]
        assert rebase["base_found"] and rebase["base_pause_token"] == st.active_pause.pause_token
        now = await next_on_cluster.get(job_id)
        ok = await next_on_cluster.intervene(job_id, iv(now, keep(now, 0), snapshot_id=new["snapshot_id"]), "rev1")
        assert ok.status_code == 200
    finally:
        await next_on_cluster.close()
