"""Redis refusing rather than failing (docs/protocol.md § Redis outages, § Executors and the outbox):
out of memory under ``maxmemory-policy noeviction`` (OOM), a replica after a failover (READONLY),
writes stopped by a failed RDB snapshot (MISCONF), and a long script past ``busy-reply-threshold``
(BUSY). redis-py raises these as ``ResponseError``s, not as connection errors; they mean the same:
the store cannot take the change now. Every route answers 503 ``STORE_UNAVAILABLE`` with
``Retry-After`` (never 500) and changes nothing; a model result whose write-back meets one is
spooled and applied once Redis takes writes again, without running the model again.

Each test starts its own redis-server (free port, the product's ``RedisServer``) and puts it into
the condition for real: ``CONFIG SET maxmemory``, ``REPLICAOF`` a second redis-server, a BGSAVE
that cannot rename its file with ``stop-writes-on-bgsave-error yes``, a Lua loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from harness.ci import require_binary
from harness.tokens import auth
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.serve_app.work.writeback import WriteBack
from hitl_review.statecore import errors
from hitl_review.statecore.durable import store_unavailable
from hitl_review.statecore.store import Store, StoreConfig
from tests.api_util import keep_all
from tests.asgi_util import asgi_client
from tests.helpers import create, detection_done, waiting_job

RDB_NAME = "refusals.rdb"  # a directory of this name in the data dir makes every BGSAVE fail


def _until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _refused(r: redis.Redis, code: str) -> bool:
    try:
        r.set("refusals:probe", "1")
    except redis.ResponseError as e:
        return code in f"{getattr(e, 'status_code', '') or ''} {e}"
    return False


class Condition:
    """Puts ``server`` into one refusing state (``enter``) and takes it out again (``clear``)."""

    code = ""

    def __init__(self, server: RedisServer, tmp_path: Path) -> None:
        self.server = server
        self.tmp_path = tmp_path
        self.r = redis.Redis(port=server.port, decode_responses=True)

    def enter(self) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.r.close()


class OutOfMemory(Condition):
    code = "OOM"

    def enter(self) -> None:
        self.r.config_set("maxmemory-policy", "noeviction")  # what `hitl up` requires of a Redis
        self.r.config_set("maxmemory", 1)
        _until(lambda: _refused(self.r, "OOM"), "OOM")

    def clear(self) -> None:
        self.r.config_set("maxmemory", 0)


class ReadOnlyReplica(Condition):
    """A failover done to us: a second server takes our data and becomes the master, and ours
    follows it as a read-only replica (the job's keys are all still there)."""

    code = "READONLY"
    other: RedisServer | None = None

    def enter(self) -> None:
        self.other = RedisServer(self.tmp_path / "other").start()
        o = redis.Redis(port=self.other.port, decode_responses=True)
        try:
            o.replicaof("127.0.0.1", self.server.port)
            _until(lambda: o.info("replication").get("master_link_status") == "up", "the other server's sync")
            o.replicaof("NO", "ONE")
        finally:
            o.close()
        self.r.replicaof("127.0.0.1", self.other.port)
        _until(lambda: self.r.info("replication").get("master_link_status") == "up", "our server following")
        _until(lambda: _refused(self.r, "READONLY"), "READONLY")

    def clear(self) -> None:
        self.r.replicaof("NO", "ONE")

    def close(self) -> None:
        super().close()
        if self.other is not None:
            self.other.stop()


class SnapshotFailing(Condition):
    """An RDB snapshot that cannot be written (its file name is taken by a directory) under
    ``stop-writes-on-bgsave-error yes`` with a save point configured."""

    code = "MISCONF"

    def _bgsave(self, status: str) -> None:
        self.r.execute_command("BGSAVE", "SCHEDULE")

        def done() -> bool:
            info = self.r.info("persistence")
            return not info["rdb_bgsave_in_progress"] and info["rdb_last_bgsave_status"] == status

        _until(done, f"a BGSAVE ending {status}")

    def enter(self) -> None:
        (self.server.data_dir / RDB_NAME).mkdir()
        self.r.config_set("stop-writes-on-bgsave-error", "yes")
        self.r.config_set("save", "3600 1")
        self._bgsave("err")
        _until(lambda: _refused(self.r, "MISCONF"), "MISCONF")

    def clear(self) -> None:
        (self.server.data_dir / RDB_NAME).rmdir()
        self._bgsave("ok")
        self.r.config_set("save", "")


class BusyScript(Condition):
    """A Lua loop past ``busy-reply-threshold``: every other command is answered BUSY until it is
    killed (it writes nothing, so SCRIPT KILL ends it)."""

    code = "BUSY"
    LOOP = (
        "local t0 = redis.call('TIME') "
        "while true do local t = redis.call('TIME') "
        "if (t[1] - t0[1]) > tonumber(ARGV[1]) then return 0 end end"
    )
    thread: threading.Thread | None = None

    def enter(self) -> None:
        self.r.config_set("busy-reply-threshold", 50)

        def loop() -> None:
            c = redis.Redis(port=self.server.port)
            try:
                c.eval(self.LOOP, 0, 60)
            except redis.ResponseError:
                pass  # killed
            finally:
                c.close()

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

        def busy() -> bool:
            try:
                self.r.ping()
            except redis.ResponseError as e:
                return str(e).startswith("BUSY")
            return False

        _until(busy, "BUSY")

    def clear(self) -> None:
        assert self.thread is not None
        while self.thread.is_alive():
            try:
                self.r.script_kill()
            except redis.ResponseError:
                pass  # not running yet or already ended
            self.thread.join(0.2)


CONDITIONS = {c.code: c for c in (OutOfMemory, ReadOnlyReplica, SnapshotFailing, BusyScript)}


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    require_binary("redis-server")
    server = RedisServer(tmp_path / "redis", extra=["--dbfilename", RDB_NAME]).start()
    yield server
    server.stop()


@pytest.fixture(params=sorted(CONDITIONS))
def condition(request: pytest.FixtureRequest, own_redis: RedisServer, tmp_path: Path) -> Iterator[Condition]:
    cond = CONDITIONS[request.param](own_redis, tmp_path)
    try:
        yield cond
    finally:
        cond.close()


async def _store(url: str) -> Store:
    store = Store.from_url(url, StoreConfig(retention_s=3600, node_timeout_s=60), timeout_s=5)
    await store.ensure_groups()
    return store


def _state_of(r: redis.Redis, job_id: str) -> dict[str, Any]:
    """The job as Redis holds it, read without the store (and after the condition cleared)."""
    from hitl_review.statecore import keys

    jk = keys.job(job_id)
    return {"meta": r.hgetall(jk.meta), "events": r.llen(jk.events), "pauses": r.hgetall(jk.pauses)}


def test_the_refusals_are_store_unavailable() -> None:
    for code in ("OOM", "READONLY", "MISCONF", "LOADING", "BUSY", "NOREPLICAS", "MASTERDOWN"):
        assert store_unavailable(redis.ResponseError(f"{code} the server says no")), code
    assert store_unavailable(redis.exceptions.OutOfMemoryError("command not allowed", status_code="OOM"))
    assert store_unavailable(redis.exceptions.ReadOnlyError("You can't write against a read only replica."))
    assert store_unavailable(redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"))
    assert store_unavailable(errors.StoreUnavailable("sync short of its acknowledgements"))
    for bug in (redis.ResponseError("WRONGTYPE Operation against a key"), redis.ResponseError("ERR syntax")):
        assert not store_unavailable(bug)
    assert not store_unavailable(ValueError("not a store error"))
    # uvloop's error for a write on a socket Redis closed a moment ago (seen in CI during a Redis restart)
    closed = "unable to perform operation on <TCPTransport closed=True reading=False 0x7f2c>; the handler is closed"
    assert store_unavailable(RuntimeError(closed))
    assert not store_unavailable(RuntimeError("dictionary changed size during iteration"))


async def test_routes_answer_503_with_retry_after_and_change_nothing(
    condition: Condition, own_redis: RedisServer, tmp_path: Path, image: Any
) -> None:
    store = await _store(own_redis.url)
    try:
        job_id = await waiting_job(store, image)
        cancelled_id = await waiting_job(store, image)
    finally:
        await store.close()
    direct = redis.Redis(port=own_redis.port, decode_responses=True)
    async with asgi_client(own_redis.url, tmp_path / "data") as c:
        snap = (await c.get(f"/api/v1/jobs/{job_id}", headers=auth("rev1"))).json()
        body = {
            "intervention_id": "iv_refused_once",
            "pause_token": snap["active_pause"]["pause_token"],
            "base_version": snap["version"],
            "subjects": keep_all(snap),
        }
        before = {j: _state_of(direct, j) for j in (job_id, cancelled_id)}
        await asyncio.to_thread(condition.enter)
        try:
            answers = [
                await c.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=auth("rev1")),
                await c.post(f"/api/v1/jobs/{cancelled_id}/cancel", headers=auth("rev1")),
            ]
        finally:
            await asyncio.to_thread(condition.clear)
        for r in answers:
            print(f"\n[{condition.code}] {r.request.method} {r.request.url.path}: {r.status_code} {r.text[:160]}")
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "STORE_UNAVAILABLE" and r.headers["Retry-After"] == "1"
        assert {j: _state_of(direct, j) for j in before} == before  # nothing written
        # Once Redis takes writes again, the same request goes through.
        ok = await c.post(f"/api/v1/jobs/{job_id}/interventions", json=body, headers=auth("rev1"))
        assert ok.status_code == 200, ok.text
        assert ok.json()["version"] == snap["version"] + 1
    direct.close()


async def test_a_write_back_refused_is_spooled_and_applied_once_redis_takes_writes(
    condition: Condition, own_redis: RedisServer, tmp_path: Path, image: Any
) -> None:
    store = await _store(own_redis.url)
    try:
        job_id = await create(store, image)
        report = await detection_done(store, job_id)
        node = (await store.get(job_id)).current_node
        assert node is not None
        wb = WriteBack(store, tmp_path / "data", first_gap_s=0.2)
        await asyncio.to_thread(condition.enter)
        try:
            applying = asyncio.create_task(wb.apply(report))
            deadline = time.monotonic() + 20
            while wb.spooled() != [node.node_instance_id]:  # refused: kept in the spool, not raised
                assert not applying.done(), applying.result()
                assert time.monotonic() < deadline, "the refused result never reached the spool"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # a retry or two, still refused
            assert not applying.done()
        finally:
            await asyncio.to_thread(condition.clear)
        assert await asyncio.wait_for(applying, 30) == "OK"
        assert wb.spooled() == []
        st = await store.get(job_id)
        assert st.status == "WAITING_USER_SELECTION" and len(st.box_list) == 3
        # The spooled result itself was applied: the same node instance completed, no other attempt.
        done = st.current_node
        assert done is not None and (done.node_instance_id, done.status) == (node.node_instance_id, "COMPLETED")
        assert done.attempt == node.attempt
    finally:
        await store.close()
