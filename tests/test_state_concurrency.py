"""Many reviewers submit against one pause at once: exactly one wins.

Each submitter is its own ``Store`` with its own connection pool, so the 64
calls really race on 64 Redis connections; the Lua script is the only arbiter.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest_asyncio

from hitl_review.statecore import errors, keys
from hitl_review.statecore.store import Reply, Store, StoreConfig

from .helpers import iv, keep, manual, waiting_job

SUBMITTERS = 64
ROUNDS = 50
LOSING = (errors.VersionConflict, errors.PauseNotActive, errors.PauseTokenMismatch)


@pytest_asyncio.fixture
async def submitters(store, redis_server):
    stores = [
        Store.from_url(redis_server.url, StoreConfig(retention_s=3600, node_timeout_s=60), max_connections=2)
        for _ in range(SUBMITTERS)
    ]
    await asyncio.gather(*(s.ping() for s in stores))  # open one connection each, up front
    yield stores
    await asyncio.gather(*(s.close() for s in stores))


def _subjects(st, i: int):
    """Different reviewers want different things: a subset of the panel, sometimes a drawn box
    (never nothing, so that every winner dispatches exactly one command)."""
    subset = keep(st, *[j for j in range(3) if (i >> j) & 1])
    drawn = [manual([300 + i, 300, 400 + i, 400], f"m{i}")] if i % 3 == 0 or not subset else []
    return subset + drawn


async def test_64_racing_submitters_one_winner(store, image, submitters):
    clients = await store.r.client_list()
    assert len(clients) >= SUBMITTERS + 1, "every submitter must hold its own connection"

    rng = random.Random(4)
    winners = set()
    for _ in range(ROUNDS):
        job_id = await waiting_job(store, image)
        st = await store.get(job_id)
        cmds_before = await store.outbox_commands(job_id)
        reqs = [(iv(st, _subjects(st, i), iid=f"iv_race_{i:02d}"), f"reviewer-{i}") for i in range(SUBMITTERS // 2)]
        calls = [reqs[k % len(reqs)] for k in range(SUBMITTERS)]  # ids 0..31, then each once more
        rng.shuffle(calls)  # who sends first changes from round to round

        async def send(k: int, req, who: str, job_id: str = job_id):
            await asyncio.sleep(rng.random() * 0.002)  # some read the job before the winner commits, some after
            return await submitters[k].intervene(job_id, req, who)

        results = await asyncio.gather(
            *(send(k, req, who) for k, (req, who) in enumerate(calls)), return_exceptions=True
        )

        wins = [(k, r) for k, r in enumerate(results) if isinstance(r, Reply)]
        losses = [r for r in results if not isinstance(r, Reply)]
        unexpected = [r for r in losses if not isinstance(r, LOSING)]
        assert not unexpected, unexpected
        fresh = [(k, r) for k, r in wins if not r.replayed]
        assert len(fresh) == 1, [(k, r.replayed) for k, r in wins]
        win_k, winner = fresh[0]
        win_iid = calls[win_k][0].intervention_id
        winners.add(win_iid)
        # The only other success is the winner's twin, answered with the same bytes.
        assert {calls[k][0].intervention_id for k, _ in wins} == {win_iid}
        assert len(wins) == 2
        assert all(r.body == winner.body for _, r in wins)
        assert json.loads(winner.body)["intervention_id"] == win_iid

        after = await store.get(job_id)
        assert after.version == st.version + 1
        for err in losses:
            assert err.snapshot["version"] == after.version and err.snapshot["status"] == after.status.value
        cmds = await store.outbox_commands(job_id)
        new = cmds[len(cmds_before) :]
        stage = json.loads(winner.body)["next_node_type"]  # the stage; one command per subject (statecore.subjects)
        if stage == "PROCESS_APPROVED_BOX_LIST":
            assert sorted(c.node_instance_id for c in new) == sorted(after.subject_nodes), "one command per subject"
            assert {c.node_type for c in new} == {"SEGMENT_SUBJECT"}
        else:
            assert [c.node_instance_id for c in new] == [after.current_node.node_instance_id], "exactly one command"
            assert new[0].node_type == stage
        hist = await store.pause_history(job_id)
        assert [(h.status, h.consumed_by.intervention_id) for h in hist] == [("CONSUMED", win_iid)]
        accepted = [e for e in await store.events_after(job_id) if e.type == "INTERVENTION_ACCEPTED"]
        assert [e.data["intervention_id"] for e in accepted] == [win_iid]
        assert await store.r.hkeys(keys.job(job_id).idem) == [win_iid]
    assert len(winners) > 1, "the race should not always be won by the same submitter"


async def test_cancel_racing_submissions(store, image, submitters):
    """A cancel and eight submissions at once: either one submission consumes the pause and the
    cancel ends the job after it, or the cancel wins and every submission is JOB_CANCELLED."""
    rng = random.Random(7)
    for _ in range(20):
        job_id = await waiting_job(store, image)
        st = await store.get(job_id)
        reqs = [iv(st, keep(st, i % 3), iid=f"iv_c{i}") for i in range(8)]

        async def submit(k: int, job_id: str = job_id, reqs: list = reqs):
            await asyncio.sleep(rng.random() * 0.002)
            return await submitters[k].intervene(job_id, reqs[k], "rev")

        async def cancel(job_id: str = job_id):
            await asyncio.sleep(rng.random() * 0.002)
            return await submitters[63].cancel(job_id, "admin")

        *subs, snap = await asyncio.gather(*(submit(k) for k in range(8)), cancel(), return_exceptions=True)
        assert not isinstance(snap, Exception), snap
        assert snap.status.value == "CANCELLED" and snap.active_pause is None
        wins = [r for r in subs if isinstance(r, Reply)]
        assert all(isinstance(r, Reply) or isinstance(r, LOSING + (errors.JobCancelled,)) for r in subs), subs
        hist = await store.pause_history(job_id)
        cmds = await store.outbox_commands(job_id)
        if wins:
            assert len(wins) == 1 and snap.version == st.version + 2
            assert [h.status for h in hist] == ["CONSUMED"] and len(cmds) == 2
        else:
            assert all(isinstance(r, errors.JobCancelled) for r in subs)
            assert snap.version == st.version + 1
            assert [h.status for h in hist] == ["CANCELLED"] and len(cmds) == 1
