"""Each promise of ``--durability strict`` across a store loss, one path at a time (docs/protocol.md §
Redis outages; issue 35 items 1-4 and 8): the model-based test (tests/test_store_loss_model.py) finds
these at random, these pin them. The FastAPI app over ASGI, a real redis-server, the SQLite archive;
reports through the store, as the dispatcher's. Redis is emptied with FLUSHALL."""

from __future__ import annotations

from pathlib import Path

from harness.executor import report
from harness.tokens import auth
from hitl_review.archive.mirror import mirror_now, reconcile
from hitl_review.serve_app.observability import metrics
from hitl_review.statecore import keys
from hitl_review.statecore.models import NodeReport

from .api_util import png
from .test_store_loss_model import BOXES, H, W, strict_control_plane


async def _create(c, key: str | None = None, quorum: int = 1, image: bytes | None = None):
    headers = auth("sub1") | ({"Idempotency-Key": key} if key else {})
    return await c.post(
        "/api/v1/jobs",
        params={"review_quorum": quorum},
        files={"image": ("i.png", image or png(W, H), "image/png")},
        headers=headers,
    )


async def _lose(store) -> None:
    await store.r.flushall()
    await store.ensure_groups()


async def _waiting(c, store, key: str | None = None, quorum: int = 1) -> dict:
    job_id = (await _create(c, key, quorum)).json()["job_id"]
    assert await report(store, job_id, {"boxes": BOXES}) == "OK"
    return (await c.get(f"/api/v1/jobs/{job_id}", headers=auth("admin"))).json()


def _body(snap: dict, iid: str) -> dict:
    return {
        "intervention_id": iid,
        "pause_token": snap["active_pause"]["pause_token"],
        "base_version": snap["version"],
        "subjects": [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in snap["box_list"]],
    }


async def test_a_creation_retried_after_the_loss_names_the_same_job(redis_server, tmp_path: Path) -> None:
    """Item 1: the same POST /jobs with its Idempotency-Key after FLUSHALL answers the first job
    (byte for byte, Idempotent-Replayed), which is back, waiting where it was; no second job."""
    async with strict_control_plane(redis_server.url, tmp_path) as (c, store, _archive):
        first = await _create(c, "batch-7:shoe.png")
        assert first.status_code == 202
        job_id = first.json()["job_id"]
        await _lose(store)
        again = await _create(c, "batch-7:shoe.png")
        assert again.status_code == 202 and again.headers.get("Idempotent-Replayed") == "true", again.text
        assert again.content == first.content
        listed = (await c.get("/api/v1/jobs", headers=auth("admin"))).json()["jobs"]
        assert [j["job_id"] for j in listed] == [job_id]
        other = await _create(c, "batch-7:shoe.png", image=png(W, H, (1, 2, 3)))
        assert other.status_code == 409 and other.json()["code"] == "IDEMPOTENCY_CONFLICT"
        await store.close()


async def test_a_decision_and_a_vote_retried_after_the_loss_get_their_first_answers(
    redis_server, tmp_path: Path
) -> None:
    """Item 2: an intervention's and a quorum vote's retries after FLUSHALL answer 200 with the bytes
    of the first answer; the vote still counts (the restore keeps it), so the second reviewer decides."""
    async with strict_control_plane(redis_server.url, tmp_path) as (c, store, _archive):
        one = await _waiting(c, store)
        url = f"/api/v1/jobs/{one['job_id']}/interventions"
        decided = await c.post(url, json=_body(one, "iv_decided"), headers=auth("rev1"))
        assert decided.status_code == 200
        voted_on = await _waiting(c, store, quorum=2)
        vote_url = f"/api/v1/jobs/{voted_on['job_id']}/interventions"
        vote = await c.post(vote_url, json=_body(voted_on, "iv_vote"), headers=auth("rev1"))
        assert vote.status_code == 200 and vote.json()["quorum"]["outcome"] == "VOTE_RECORDED", vote.text
        await _lose(store)
        again = await c.post(url, json=_body(one, "iv_decided"), headers=auth("rev1"))
        assert (again.status_code, again.text) == (200, decided.text)
        assert again.headers.get("Idempotent-Replayed") == "true"
        vote_again = await c.post(vote_url, json=_body(voted_on, "iv_vote"), headers=auth("rev1"))
        assert (vote_again.status_code, vote_again.text) == (200, vote.text)
        now = (await c.get(f"/api/v1/jobs/{voted_on['job_id']}", headers=auth("admin"))).json()
        assert [v["reviewer"] for v in now["quorum"]["votes"]] == ["rev1"], now["quorum"]
        second = await c.post(vote_url, json=_body(now, "iv_vote2"), headers=auth("rev2"))
        assert second.status_code == 200 and second.json()["status"] == "PROCESSING_APPROVED_SUBJECTS", second.text
        await store.close()


async def test_a_job_that_ended_by_a_report_never_works_again(redis_server, tmp_path: Path) -> None:
    """Item 3: a job ended by the finalize report (no request of a client wrote it) stays SUCCEEDED at
    its version after FLUSHALL, before the archive has its copy: read from its row, never restored."""
    async with strict_control_plane(redis_server.url, tmp_path) as (c, store, archive):
        snap = await _waiting(c, store)
        job_id = snap["job_id"]
        r = await c.post(f"/api/v1/jobs/{job_id}/interventions", json=_body(snap, "iv_1"), headers=auth("rev1"))
        assert r.status_code == 200
        now = (await c.get(f"/api/v1/jobs/{job_id}", headers=auth("admin"))).json()
        cuts = [
            {"box_id": b["box_id"], "status": "SUCCEEDED", "mask": f"m{i}.png", "cutout": f"c{i}.png"}
            for i, b in enumerate(now["approved_box_list"])
        ]
        assert await report(store, job_id, {"subjects": cuts}) == "OK"
        assert await report(store, job_id, {}) == "OK"  # FINALIZE_RESULTS
        done = (await c.get(f"/api/v1/jobs/{job_id}", headers=auth("sub1"))).json()
        assert done["status"] == "SUCCEEDED"
        results = (await c.get(f"/api/v1/jobs/{job_id}/results", headers=auth("sub1"))).json()
        await _lose(store)
        assert (await reconcile(store, archive))["counts"] == {"TERMINAL": 1}
        after = await c.get(f"/api/v1/jobs/{job_id}", headers=auth("sub1"))
        assert after.status_code == 200 and after.json()["status"] == "SUCCEEDED"
        assert after.json()["version"] == done["version"]
        assert (await c.get(f"/api/v1/jobs/{job_id}/results", headers=auth("sub1"))).json() == results
        assert not await store.r.exists(keys.job(job_id).meta)  # nothing was put back to work
        await store.close()


async def test_a_report_replayed_on_a_restored_job_is_a_duplicate(redis_server, tmp_path: Path) -> None:
    """Item 4: the detection's report delivered again after the job was restored (its reports set went
    with Redis; the ended node is still the job's current one) is DUPLICATE, writes nothing."""
    async with strict_control_plane(redis_server.url, tmp_path) as (c, store, archive):
        job_id = (await _create(c)).json()["job_id"]
        node = (await store.get(job_id)).current_node
        rep = NodeReport(
            node_instance_id=node.node_instance_id,
            node_type=node.node_type,
            job_id=job_id,
            outcome="SUCCEEDED",
            output={"boxes": BOXES},
        )
        assert await store.apply_report(rep) == "OK"
        await mirror_now(store, archive, job_id)  # as the periodic mirror would (fast), or the journal did
        await _lose(store)
        restored = (await c.get(f"/api/v1/jobs/{job_id}", headers=auth("admin"))).json()
        assert restored["status"] == "WAITING_USER_SELECTION"
        jk = keys.job(job_id)
        before = (await store.r.hgetall(jk.meta), await store.r.smembers(jk.reports))
        assert await store.apply_report(rep) == "DUPLICATE"
        after = (await store.r.hgetall(jk.meta), await store.r.smembers(jk.reports))
        assert {k: v for k, v in after[0].items() if not k.startswith("audit_")} == {
            k: v for k, v in before[0].items() if not k.startswith("audit_")
        }
        assert after[1] == before[1]
        await store.close()


async def test_a_change_whose_row_cannot_be_written_is_refused_and_counted(redis_server, tmp_path: Path) -> None:
    """Item 8 (and the journal's failure path): the archive refuses the row, so the creation is not
    acknowledged (503 STORE_UNAVAILABLE, retry) and hitl_mirror_write_failures_total{path="journal"}
    moves; once the archive answers, the retry is answered as a replay and the row is written."""
    async with strict_control_plane(redis_server.url, tmp_path) as (c, store, archive):
        failures = metrics.MIRROR_FAILURES.labels("journal")
        before = failures._value.get()
        engine_url = archive.engine.url
        archive.engine.dispose()
        (tmp_path / "archive.sqlite3").rename(tmp_path / "away.sqlite3")
        (tmp_path / "archive.sqlite3").mkdir()  # a path SQLite cannot open
        refused = await _create(c, "k-503")
        assert refused.status_code == 503 and refused.json()["code"] == "STORE_UNAVAILABLE", refused.text
        assert failures._value.get() == before + 1
        (tmp_path / "archive.sqlite3").rmdir()
        (tmp_path / "away.sqlite3").rename(tmp_path / "archive.sqlite3")
        assert str(archive.engine.url) == str(engine_url)
        again = await _create(c, "k-503")
        assert again.status_code == 202 and again.headers.get("Idempotent-Replayed") == "true"
        await _lose(store)
        assert (await c.get(f"/api/v1/jobs/{again.json()['job_id']}", headers=auth("sub1"))).status_code == 200
        await store.close()
