"""An inspector sweep reads every partition it holds in a few pipelined round trips, not four
sequential ones per partition (issue 37: 257 round trips a sweep, every few seconds, in every Api
replica, idle or not). Counted on the wire (tests/redis_traffic), not timed; on a cluster too."""

from __future__ import annotations

from hitl_review.serve_app.work.inspector import Inspector
from hitl_review.statecore import keys

from .helpers import THREE_BOXES, waiting_job
from .redis_traffic import traffic


async def test_a_sweep_takes_a_few_round_trips_whatever_the_partitions(store, image):
    await waiting_job(store, image, THREE_BOXES)
    inspector = Inspector(store, owner="i1")
    with traffic() as seen:
        counts = await inspector.sweep()
    assert counts["partitions"] == keys.PARTITIONS  # every lease taken: each partition was read
    # PING, TIME, SCRIPT EXISTS (+ SCRIPT LOAD the first time), one pipeline: 259 before (4 per partition)
    assert seen.round_trips <= 5, (seen.round_trips, seen.commands)
    with traffic() as again:  # renewing the leases held: the same
        assert (await inspector.sweep())["partitions"] == keys.PARTITIONS
    assert again.round_trips <= 4, again.round_trips
    assert Inspector(store, owner="i2")._held == {}
    assert (await Inspector(store, owner="i2").sweep())["partitions"] == 0  # held by i1: no lease, no verdict


async def test_a_sweep_on_a_cluster_reads_every_partition(cluster_store, image):
    inspector = Inspector(cluster_store, owner="i1")
    counts = await inspector.sweep()
    assert counts["partitions"] == keys.PARTITIONS
    assert inspector.held() == list(range(keys.PARTITIONS))


async def test_under_strict_durability_the_leases_are_synced_once_a_sweep(store):
    store.sync_command, store.sync_acks = ("WAITAOF", 1, 0, 2000), 1  # as durability.configure on Redis >= 7.2
    if tuple(int(x) for x in (await store.r.info("server"))["redis_version"].split(".")[:2]) < (7, 2):
        store.sync_command, store.sync_acks = None, 0
    with traffic() as seen:
        assert (await Inspector(store, owner="i1").sweep())["partitions"] == keys.PARTITIONS
    assert seen.commands["WAITAOF"] == (1 if store.sync_command else 0), seen.commands
