"""Alembic runs once, however many processes start at the same time (issue 20): on a cluster every Api
and Archiver replica calls ``archive.migrate.upgrade`` as it starts, and a Kubernetes Job
(deploy/kuberay/archive-migrate.yaml) may run it at the same moment. On PostgreSQL the upgrade holds
an advisory lock for its transaction, so the others wait, find the schema at head and do nothing.

A real PostgreSQL (harness.postgres, the session's ``postgres`` fixture); the upgrades run in
processes of their own, as replicas do, released together by a barrier."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from hitl_review.archive import migrate
from hitl_review.archive.db import normalize_url

N = 6


def _upgrade_together(url: str, barrier: Any) -> str:  # a Manager's Barrier proxy
    barrier.wait(timeout=60)
    return migrate.upgrade(url)


@pytest.fixture
def empty_postgres(postgres) -> str:
    postgres.reset()
    return str(postgres.url)


def test_concurrent_upgrades_on_one_postgresql_all_succeed_and_leave_one_schema(empty_postgres: str):
    url = empty_postgres
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each, as a replica is
    with ctx.Manager() as manager:
        barrier = manager.Barrier(N)
        with ProcessPoolExecutor(N, mp_context=ctx) as pool:
            futures = [pool.submit(_upgrade_together, url, barrier) for _ in range(N)]
            outcomes = []
            for f in futures:
                try:
                    outcomes.append(f.result(timeout=120))
                except Exception as e:  # what a replica racing another one would die of
                    outcomes.append(f"{type(e).__name__}: {e}")
    assert outcomes == [migrate.head()] * N, outcomes
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
            tables = conn.execute(
                text("SELECT count(*) FROM information_schema.tables WHERE table_name = 'alembic_version'")
            ).scalar_one()
    finally:
        engine.dispose()
    assert versions == [migrate.head()] and tables == 1
    assert migrate.schema_version(url) == migrate.head()
    assert migrate.upgrade(url) == migrate.head()  # and once more, alone: a no-op


def test_the_lock_key_is_one_number_for_every_process():
    """Every process must ask for the same advisory lock: a constant, not a hash that varies per run."""
    assert isinstance(migrate.LOCK_KEY, int) and -(2**63) <= migrate.LOCK_KEY < 2**63
