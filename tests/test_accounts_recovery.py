"""Reviewer accounts survive a Redis that comes back empty (docs/protocol.md § Reviewer accounts):
against a real redis-server and a real SQLite archive (migrated as ``hitl up`` migrates it).

* an account added at run time is copied to the archive (name, role, the token's SHA-256, never the
  token); after FLUSHALL its token signs in at once (the unknown token has the accounts written back
  first), the restore is in the stream of changes, and the archiver's pass restores them too;
* an account removed before the loss stays removed (the archive forgot it first), also when the
  archive was read before the removal (``reviewer_restore.lua`` writes nothing while Redis still
  holds its accounts hash, which outlives its last account);
* an archive that cannot keep an account refuses the addition (503) and leaves nothing half-added.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hitl_review.archive import accounts as kept_accounts
from hitl_review.archive import migrate
from hitl_review.archive.db import Archive
from hitl_review.serve_app.recovery.recovery import Recovery
from hitl_review.statecore import accounts, keys
from hitl_review.statecore.store import Store

from .test_reviewer_accounts import ADMIN, API, _add, bearer, replica


@pytest.fixture
def archive(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    migrate.upgrade(url)
    a = Archive(url)
    yield a
    a.close()


async def test_accounts_come_back_after_flushall_and_a_removed_one_stays_removed(
    store: Store, redis_server: Any, tmp_path: Path, archive: Archive
) -> None:
    async with replica(redis_server.url, tmp_path / "a", archive=archive) as on_a:
        async with on_a() as a:
            alice, bob = await _add(a, "alice"), await _add(a, "bob", role="submitter")
            gone = await _add(a, "carol")
            assert (await a.delete(f"{API}/admin/reviewers/carol", headers=ADMIN)).status_code == 200
            kept = {k.name: k for k in kept_accounts.load_all(archive)}
            assert set(kept) == {"alice", "bob"}  # carol forgotten with her removal
            assert kept["alice"].token_hash == accounts.token_hash(alice["token"]) and kept["bob"].role == "submitter"
            assert alice["token"] not in json.dumps([k.__dict__ for k in kept.values()])  # the hash, never the token

            await store.r.flushall()  # Redis comes back empty
            assert await accounts.lost(store.r)
            r = await a.get(f"{API}/whoami", headers=bearer(alice["token"]))  # no admin, no restart
            assert r.status_code == 200 and r.json() == {"name": "alice", "role": "reviewer"}, r.text
            assert (await a.get(f"{API}/whoami", headers=bearer(bob["token"]))).json()["role"] == "submitter"
            assert (await a.get(f"{API}/whoami", headers=bearer(gone["token"]))).status_code == 401
            listed = (await a.get(f"{API}/admin/reviewers", headers=ADMIN)).json()["accounts"]
            assert [x["name"] for x in listed] == ["alice", "bob"] and listed[0]["added_by"] == "admin"
            changes = await accounts.changes(store.r)
            assert sorted((c["action"], c["name"], c["by"]) for c in changes) == [
                ("restore", "alice", "recovery"),
                ("restore", "bob", "recovery"),
            ]

            # The last account removed: its hash stays (the '~' field), so nothing is written back.
            for name in ("alice", "bob"):
                assert (await a.delete(f"{API}/admin/reviewers/{name}", headers=ADMIN)).status_code == 200
            assert not await accounts.lost(store.r) and kept_accounts.load_all(archive) == []
            assert (await a.get(f"{API}/whoami", headers=bearer(alice["token"]))).status_code == 401


async def test_a_stale_read_of_the_archive_never_brings_a_removed_account_back(
    store: Store, redis_server: Any, tmp_path: Path, archive: Archive
) -> None:
    async with replica(redis_server.url, tmp_path / "a", archive=archive) as on_a:
        async with on_a() as a:
            dave = await _add(a, "dave")
            read_before = kept_accounts.load_all(archive)  # what a restore read just before the removal
            assert (await a.delete(f"{API}/admin/reviewers/dave", headers=ADMIN)).status_code == 200
            assert await accounts.restore(store, read_before) == 0  # Redis still holds its accounts hash
            assert (await a.get(f"{API}/whoami", headers=bearer(dave["token"]))).status_code == 401

    # The archiver's pass restores what an emptied Redis lost before anyone asks.
    erin = None
    async with replica(redis_server.url, tmp_path / "b", archive=archive) as on_b:
        async with on_b() as b:
            erin = await _add(b, "erin")
    await store.r.flushall()
    recovery = Recovery(store, archive, data_dir=tmp_path, who="archiver-test")
    assert await recovery.restore_accounts() == 1
    assert await recovery.restore_accounts() == 0  # once: the hash is back
    assert await accounts.lookup(store.r, accounts.token_hash(erin["token"])) is not None


async def test_an_archive_that_cannot_keep_the_account_refuses_it_whole(
    store: Store, redis_server: Any, tmp_path: Path, archive: Archive
) -> None:
    with archive.transaction() as s:  # the archive's table gone: every write to it fails
        s.connection().exec_driver_sql("DROP TABLE reviewer_accounts")
    async with replica(redis_server.url, tmp_path / "a", archive=archive) as on_a:
        async with on_a() as a:
            r = await a.post(f"{API}/admin/reviewers", json={"name": "frank"}, headers=ADMIN)
            assert r.status_code == 503 and r.json()["code"] == "STORE_UNAVAILABLE", r.text
            assert "not added" in r.json()["message"]
            assert await store.r.hget(keys.REVIEWERS, "n:frank") is None  # nothing half-added
            listed = (await a.get(f"{API}/admin/reviewers", headers=ADMIN)).json()["accounts"]
            assert listed == []
