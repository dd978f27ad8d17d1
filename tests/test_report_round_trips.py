"""A node's start reads the job and Redis's clock in one round trip, then writes through its script:
two round trips, not three (issue 37: every transition of every job paid the extra one). Counted on
the wire (tests/redis_traffic); on a cluster the clock is read on the job's own master, still one trip."""

from __future__ import annotations

from .helpers import create
from .redis_traffic import traffic


async def _start_round_trips(store, image) -> int:
    job_id = await create(store, image)
    node = (await store.get(job_id)).current_node
    first = await create(store, image)  # started first: loads the script, warms the pool
    warm = (await store.get(first)).current_node
    assert await store.node_started_by(first, warm.node_instance_id, warm.node_type.value) == "OK"
    with traffic() as seen:
        assert await store.node_started_by(job_id, node.node_instance_id, node.node_type.value) == "OK"
    assert seen.commands["HGETALL"] == 1 and seen.commands["EVALSHA"] == 1, seen.commands
    return seen.round_trips


async def test_a_start_reads_the_job_and_the_clock_in_one_round_trip(store, image):
    assert await _start_round_trips(store, image) == 2


async def test_on_a_cluster_too(cluster_store, image):
    assert await _start_round_trips(cluster_store, image) == 2
