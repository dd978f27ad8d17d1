"""``--durability strict`` and the external-Redis check (serve_app.recovery.durability), on real redis-servers:
strict waits, on the write's own connection, for the replicas (WAIT) where the server has no
WAITAOF (Redis < 7.2), so a write a replica did not confirm is a 503, never a silent 200; a Redis
that could lose or evict keys is refused unless ``--allow-volatile-redis``."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from harness.ci import require_binary
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.serve_app.recovery import durability
from hitl_review.statecore import errors
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.store import Store


@pytest.fixture
def primary_and_replica(tmp_path: Path):
    require_binary("redis-server")
    primary = RedisServer(tmp_path / "primary", appendfsync="always").start()
    replica = RedisServer(tmp_path / "replica", extra=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        r = redis.Redis(port=primary.port)
        deadline = time.monotonic() + 20
        while "online" not in str(r.info("replication").get("slave0", "")):
            assert time.monotonic() < deadline, "the replica did not attach"
            time.sleep(0.1)
        r.close()
        yield primary, replica
    finally:
        if replica.proc is not None:
            os.kill(replica.proc.pid, signal.SIGCONT)
        replica.stop()
        primary.stop()


async def test_strict_waits_for_the_replica_and_refuses_what_it_did_not_confirm(primary_and_replica, image: ImageRef):
    primary, replica = primary_and_replica
    store = Store.from_url(primary.url, timeout_s=2.0)
    try:
        how = await durability.configure(store, "strict", 0.5)
        version = tuple(int(x) for x in (await store.r.info("server"))["redis_version"].split(".")[:2])
        if version >= (7, 2):
            assert store.sync_command == ("WAITAOF", 1, 0, 500), how
        else:
            assert store.sync_command == ("WAIT", 1, 500) and store.sync_acks == 1, how
        await store.ensure_groups()
        assert (await store.create_job("alice", image, "k1")).status_code == 202
        if version >= (7, 2):
            return  # WAITAOF 1 0 asks for the local fsync only: a stopped replica does not matter
        assert replica.proc is not None
        os.kill(replica.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(errors.StoreUnavailable):
            await store.create_job("alice", image, "k2")
        assert time.monotonic() - t0 < 2.0
        os.kill(replica.proc.pid, signal.SIGCONT)
        # The write itself happened on the primary: resent with its key, it is replayed, once confirmed.
        deadline = time.monotonic() + 10
        while True:
            try:
                reply = await store.create_job("alice", image, "k2")
                break
            except errors.StoreUnavailable:
                assert time.monotonic() < deadline
        assert reply.replayed
    finally:
        await store.close()


async def test_fast_and_strict_without_replicas_on_redis_7_0_need_no_wait(redis_server):
    store = Store.from_url(redis_server.url)
    try:
        assert "fast" in await durability.configure(store, "fast", 1.0) and store.sync_command is None
        await durability.configure(store, "strict", 1.0)
        version = tuple(int(x) for x in (await store.r.info("server"))["redis_version"].split(".")[:2])
        assert (store.sync_command is None) == (version < (7, 2))
    finally:
        await store.close()


def test_external_redis_that_could_lose_or_evict_keys_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    require_binary("redis-server")
    volatile = RedisServer(
        tmp_path / "volatile",
        extra=["--appendonly", "no", "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"],
    ).start()
    try:
        problems = durability.external_problems(volatile.url)
        assert any("persistence is off" in p for p in problems) and any("allkeys-lru" in p for p in problems)
        with pytest.raises(SystemExit, match="--allow-volatile-redis"):
            durability.check_external(volatile.url, allow_volatile=False)
        with caplog.at_level(logging.WARNING, logger="hitl.durability"):
            durability.check_external(volatile.url, allow_volatile=True)
        assert "VOLATILE REDIS" in caplog.text
    finally:
        volatile.stop()


def test_external_redis_with_aof_and_noeviction_is_accepted(redis_server):
    assert durability.external_problems(redis_server.url) == []
    assert durability.external_problems(redis_server.url, durability="strict") == [
        "--durability strict asks for appendfsync always; this Redis has everysec"
    ]
