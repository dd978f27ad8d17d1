"""Write-back with layered retries and dead letters (docs/protocol.md § Executors and the outbox).

Real redis-server processes (stopped and started again under the dispatcher), real Dispatchers,
the control plane under uvicorn for the admin routes and the ``hitl admin`` commands. The model
is a stand-in that counts its calls and, while it runs, stops the Redis its result must go to."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.ci import require_binary
from harness.tokens import TOKENS_SPEC, auth
from harness.uvicorn import LocalServer
from hitl_review.serve_app import cli
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.serve_app.work.dispatcher import Dispatcher
from hitl_review.statecore import counters, deadletters
from hitl_review.statecore.execution import RunSpec, run_started
from hitl_review.statecore.models import NodeCommand, NodeReport
from hitl_review.statecore.store import Store, StoreConfig

from .helpers import THREE_BOXES


class StopsRedisModel:
    """Answers three boxes; with ``server``, stops that Redis first (the write-back then fails)."""

    def __init__(self, server: RedisServer | None = None) -> None:
        self.server = server
        self.calls: list[str] = []

    async def run(self, cmd: NodeCommand, spec: RunSpec) -> dict[str, Any]:
        async def work() -> dict[str, Any]:
            self.calls.append(cmd.node_instance_id)
            if self.server is not None:
                await asyncio.to_thread(self.server.stop)
            return {"boxes": THREE_BOXES}

        return await run_started(spec, work)


def _dispatcher(store: Store, model: Any, data_dir: Path | None, consumer: str, **kw: Any) -> Dispatcher:
    return Dispatcher(
        store,
        model,
        consumer=consumer,
        data_dir=data_dir,
        reclaim_every_s=kw.pop("reclaim_every_s", 3600),
        inspect_every_s=3600,  # the inspector stays out: the node's fate is the write-back's
        heartbeat_lapse_s=600,
        **kw,
    )


async def _outbox_empty(store: Store) -> bool:
    return await store.outbox_pending() == 0


async def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.wait_for(check(), timeout)
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancel a dispatcher and wait for it: it must stop (a cancel swallowed inside redis-py once kept
    one reading the outbox for ever under CPU load: statecore.durable.reraise_if_cancelled)."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=30)
    assert done, "the dispatcher did not stop within 30 s of its cancel"


@pytest.fixture
def own_redis(tmp_path: Path):
    require_binary("redis-server")
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


async def _fresh(url: str, node_timeout_s: float = 60) -> Store:
    store = Store.from_url(url, StoreConfig(retention_s=3600, node_timeout_s=node_timeout_s), timeout_s=2)
    await store.r.flushdb()
    await store.ensure_groups()
    return store


async def test_a_result_redis_cannot_take_is_spooled_survives_a_restart_and_is_applied_once(own_redis, tmp_path, image):
    data_dir = tmp_path / "data"
    store = await _fresh(own_redis.url)
    model = StopsRedisModel(own_redis)
    job_id = (await store.create_job("alice", image)).job_id
    d1 = _dispatcher(store, model, data_dir, "d1")
    t1 = asyncio.create_task(d1.run_forever())
    try:
        await _until(lambda: _async(d1.writeback.spooled()), 20, "the report in the spool")
    finally:
        await _stop(t1)  # the replica goes away with the result only in its spool
        await store.close()
    # Stopped means stopped: none of its calls still retries the write-back (the stop came while its
    # loop waited out the outage; such a call once applied the spooled result beside the next
    # dispatcher, and the failure was counted twice).
    assert [t for t in d1._tasks if not t.done()] == []
    (spooled,) = list((data_dir / "spool").glob("*.json"))
    rec = json.loads(spooled.read_text())
    assert rec["report"]["job_id"] == job_id and rec["report"]["outcome"] == "SUCCEEDED" and not rec["dead"]

    own_redis.start()  # Redis is back; a new dispatcher on the same data dir takes the spool up
    model.server = None
    store2 = Store.from_url(own_redis.url, StoreConfig(retention_s=3600, node_timeout_s=60), timeout_s=2)
    d2 = _dispatcher(store2, model, data_dir, "d2")
    t2 = asyncio.create_task(d2.run_forever())
    try:
        await _until(
            lambda: _status_is(store2, job_id, "WAITING_USER_SELECTION"), 20, "the spooled report to be applied"
        )
        await _until(lambda: _async(not d2.writeback.spooled()), 10, "the spool file to go")
        assert len(model.calls) == 1  # the model ran once: its result was kept, not recomputed
        types = [e.type for e in await store2.events_after(job_id)]
        assert types.count("NODE_COMPLETED") == 1 and "REPORT_IGNORED" not in types
        snap = await counters.read(store2.r)
        assert snap.totals["writeback_failures"] == 1 and snap.totals["dead_letters"] == 0
        assert await store2.outbox_pending() == 0  # the first replica's delivery was acknowledged
    finally:
        await _stop(t2)
        await store2.close()


async def test_after_the_last_retry_the_result_is_a_dead_letter_listed_and_replayed(own_redis, tmp_path, image, capsys):
    api = LocalServer(tmp_path / "api", redis_url=own_redis.url, dispatchers=0, tokens=TOKENS_SPEC).start()
    store = await _fresh(own_redis.url, node_timeout_s=2)  # the retries end 2 s after the first failure
    model = StopsRedisModel(own_redis)
    job_id = (await store.create_job("alice", image)).job_id
    d = _dispatcher(store, model, tmp_path / "data", "d")
    task = asyncio.create_task(d.run_forever())
    try:
        spool = tmp_path / "data" / "spool"
        await _until(lambda: _async(_dead_in_spool(spool)), 30, "the last retry to fail")
        own_redis.start()  # the dead letter is written once Redis answers again
        await _until(lambda: _async(not d.writeback.spooled()), 20, "the dead letter to be stored")
        assert len(model.calls) == 1
        with httpx.Client(base_url=api.url, headers=auth("admin"), timeout=10) as http:
            (letter,) = http.get("/api/v1/admin/dead-letters").json()
            assert letter["job_id"] == job_id and letter["kind"] == "report"
            assert letter["reason"].startswith("WRITE_BACK_FAILED") and letter["payload"]["outcome"] == "SUCCEEDED"
            snap = await counters.read(store.r)
            assert snap.totals["dead_letters"] == 1 and snap.totals["writeback_failures"] == 1
            assert (await store.get(job_id)).status == "DETECTING"  # a dead letter decides nothing

            r = http.post(f"/api/v1/admin/dead-letters/{letter['id']}/replay")
            assert r.status_code == 200, r.text
            assert r.json() == {"id": letter["id"], "job_id": job_id, "kind": "report", "result": "APPLIED"}
            assert (await store.get(job_id)).status == "WAITING_USER_SELECTION"
            assert http.get("/api/v1/admin/dead-letters").json() == []
            again = http.post(f"/api/v1/admin/dead-letters/{letter['id']}/replay")
            assert again.status_code == 404 and again.json()["code"] == "DEAD_LETTER_NOT_FOUND"

        # From the command line: a report for a job cancelled meanwhile is REPORT_IGNORED.
        other = (await store.create_job("alice", image)).job_id
        nid = (await store.get(other)).current_node.node_instance_id
        await store.cancel(other, "rev1")
        report = NodeReport(node_instance_id=nid, node_type="DETECT_SUBJECTS", job_id=other, outcome="SUCCEEDED")
        dl = await deadletters.add(
            store.r, job_id=other, kind="report", reason="WRITE_BACK_FAILED: test", payload=report.model_dump()
        )
        conn = ["--api-url", api.url, "--token", "tok-admin", "--json"]
        capsys.readouterr()
        assert await asyncio.to_thread(cli.main, ["admin", "dead-letters", *conn]) == 0
        assert [x["id"] for x in json.loads(capsys.readouterr().out)] == [dl.id]
        assert await asyncio.to_thread(cli.main, ["admin", "replay", dl.id, *conn]) == 0
        assert json.loads(capsys.readouterr().out)["result"] == "REPORT_IGNORED"
        assert "REPORT_IGNORED" in [e.type for e in await store.events_after(other)]
        assert await deadletters.list_all(store.r) == []
    finally:
        await _stop(task)
        await store.close()
        api.stop()


async def test_a_command_delivered_more_than_max_deliveries_times_is_a_dead_letter(store, image):
    job_id = (await store.create_job("alice", image)).job_id
    # A dispatcher that died on it, four times: the group delivered the command four times.
    assert len(await store.outbox_read("ghost", block_ms=0)) == 1
    for _ in range(3):
        assert len(await store.outbox_reclaim("ghost", 0)) == 1
    await asyncio.sleep(0.3)
    model = StopsRedisModel()
    d = _dispatcher(store, model, None, "d", max_deliveries=4, reclaim_idle_ms=200, reclaim_every_s=0.1)
    task = asyncio.create_task(d.run_forever())
    try:
        (letter,) = await _until(lambda: deadletters.list_all(store.r), 20, "the dead letter")
        assert letter.kind == "command" and letter.job_id == job_id
        assert letter.reason.startswith("MAX_DELIVERIES_EXCEEDED") and model.calls == []
        assert await store.outbox_pending() == 0  # acknowledged, not delivered again
        assert (await counters.read(store.r)).totals["dead_letters"] == 1
        # Its job does not sit queued for ever: the node failed, visibly, and the job with it.
        state = await store.get(job_id)
        assert state.status == "FAILED" and state.reason_code == "MAX_DELIVERIES_EXCEEDED"
        failed = [e for e in await store.events_after(job_id, 0) if e.type == "NODE_FAILED"]
        assert [e.data["reason"] for e in failed] == ["MAX_DELIVERIES_EXCEEDED"]
        assert await store.backlog() == (0, 0.0)  # nothing left counted as queued
        # Replayed, the command is queued again, but its node is no longer current: nothing runs.
        done = await deadletters.replay(store, letter.id)
        assert done.result == "REQUEUED"
        await _until(lambda: _outbox_empty(store), 20, "the re-queued command to be skipped")
        assert model.calls == [] and (await store.get(job_id)).status == "FAILED"
    finally:
        await _stop(task)


@pytest.mark.parametrize("who", ["rev1", "sub1", "exec"])
def test_only_admin_may_list_or_replay_dead_letters(api_server, who):
    with httpx.Client(base_url=api_server.url, timeout=10) as http:
        for method, path in [
            ("GET", "/api/v1/admin/dead-letters"),
            ("POST", "/api/v1/admin/dead-letters/dl_p1_" + "0" * 32 + "/replay"),
        ]:
            r = http.request(method, path, headers=auth(who))
            assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN", (who, method, r.text)
            assert http.request(method, path).status_code == 401
        assert http.get("/api/v1/admin/dead-letters", headers=auth("admin")).status_code == 200
        missing = http.post("/api/v1/admin/dead-letters/dl_p1_" + "0" * 32 + "/replay", headers=auth("admin"))
        assert missing.status_code == 404 and missing.json()["code"] == "DEAD_LETTER_NOT_FOUND"


async def _async(value: Any) -> Any:
    return value


async def _status_is(store: Store, job_id: str, status: str) -> bool:
    return (await store.get(job_id)).status == status


def _dead_in_spool(spool: Path) -> bool:
    return any(json.loads(p.read_text()).get("dead") for p in spool.glob("*.json"))


def test_max_deliveries_and_the_data_dir_reach_the_dispatcher(tmp_path):
    from hitl_review.serve_app.ops.launcher import settings_from_args
    from hitl_review.serve_app.serving.runtime import make_dispatcher

    settings = settings_from_args(cli.build_parser().parse_args(["up", "--max-deliveries", "3"]))
    assert settings.max_deliveries == 3
    assert settings_from_args(cli.build_parser().parse_args(["up"])).max_deliveries == 10
    d = make_dispatcher(settings.model_copy(update={"data_dir": tmp_path}), None, StopsRedisModel())
    assert d.max_deliveries == 3 and d.writeback.spool_dir == tmp_path / "spool"
