"""An idle dispatcher's read of the outbox is one round trip, not one per partition (issue 37: with
one free slot it used to ask the 64 streams one after the other, every idle second), and a read
with few free slots still takes no more commands than it can start: what it does not take stays
undelivered, for another dispatcher now, never parked in this one's pending list until a reclaim."""

from __future__ import annotations

from hitl_review.statecore import keys

from .redis_traffic import traffic


async def pending(store) -> int:
    """Entries delivered to some dispatcher and not acknowledged, over every partition."""
    return sum([int((await store.r.xpending(s, keys.OUTBOX_GROUP))["pending"]) for s in keys.all_outboxes()])


async def test_an_idle_poll_with_one_free_slot_is_one_round_trip(store):
    store.view_ttl_ms = 1000  # a loaded machine may pause longer than 50 ms between the two reads
    with traffic() as idle:
        assert await store.outbox_read("d1", count=1, block_ms=0) == []
    assert idle.round_trips == 1, idle.commands
    with traffic() as waited:
        assert await store.outbox_read("d1", count=1, block_ms=50) == []
    assert waited.round_trips == 1, waited.commands  # the blocking wait: the look just before saw nothing


async def test_a_read_takes_only_what_it_can_start_and_leaves_the_rest_undelivered(store, image):
    made = set()
    while len({keys.partition_of(j) for j in made}) < 3:  # commands in three partitions at least
        made.add((await store.create_job("alice", image.model_copy(update={"sha256": f"{len(made):064x}"}))).job_id)
    with traffic() as busy:
        got = await store.outbox_read("d1", count=1, block_ms=1000)
    assert len(got) == 1 and busy.round_trips == 2  # the look, then one read where there is work
    assert await pending(store) == 1  # nothing claimed beyond the free slot
    more = await store.outbox_read("d2", count=len(made) + 5, block_ms=0)
    assert {e.command.job_id for e in [*got, *more]} == made  # another dispatcher takes the rest
    assert await pending(store) == len(made)
    assert await store.outbox_read("d1", count=1, block_ms=0) == []


async def test_successive_single_reads_move_across_partitions(store, image):
    jobs = [
        (await store.create_job("alice", image.model_copy(update={"sha256": f"{i:064x}"}))).job_id for i in range(12)
    ]
    parts = {keys.partition_of(j) for j in jobs}
    seen = []
    for _ in jobs:
        (entry,) = await store.outbox_read("d1", count=1, block_ms=0)
        seen.append(keys.partition_of(entry.command.job_id))
    assert set(seen) == parts
    # No partition is asked again before every other partition with work was: a partition's second
    # command comes after the first command of each partition.
    firsts = [seen.index(p) for p in parts]
    assert max(firsts) < len(parts)
