"""The live mirror and reconcile (docs/protocol.md § Reconcile).

Redis stays the only place where a pause is consumed; the archive keeps, asynchronously, what each
live job looked like (its meta hash and pause history, as Redis holds them) so that a Redis that
lost live jobs (a restart without persistence, a failover to an empty replica) can be given them
back. :class:`Mirror` runs in the archiver's loop (``serve_app.archive_loop``) once per inspector
period over the partitions whose archiver lease it holds (never on the intervention's path): it
reads the live indexes, and writes the jobs whose version moved since it last wrote them. A job
seen finished in Redis leaves the mirror (the archive has it); a job that vanished from Redis
stays: that is what reconcile restores.
:func:`reconcile` restores every mirrored job Redis does not hold and the archive does not have
as finished (``statecore.restore``): a fresh pause for a waiting job (the old token refused), the
node queued again for a job in model work; a consumed pause is never reopened.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select

from statecore import keys
from statecore.restore import restore

from .db import Archive
from .schema import ArchivedJob, LiveMirror

log = logging.getLogger("hitl.mirror")

LIVE = (keys.waiting, keys.queued, keys.running)


class Mirror:
    """One archiver's mirror: what it wrote last (job id → version), so an unchanged job costs
    one HGET per period and nothing in the database."""

    def __init__(self, store: Any, archive: Archive) -> None:
        self.store = store
        self.archive = archive
        self.written: dict[str, int] = {}

    async def sync(self, partitions: Iterable[int]) -> Counter[str]:
        counts: Counter[str] = Counter()
        r = self.store.r
        parts = list(partitions)
        async with r.pipeline(transaction=False) as pipe:
            for p in parts:
                for index in LIVE:
                    pipe.zrange(index(p), 0, -1)
            res = await pipe.execute()
        live = {j if isinstance(j, str) else j.decode() for ids in res for j in ids}
        gone = [j for j in self.written if keys.partition_of(j) in set(parts) and j not in live]
        ids = sorted(live) + gone
        async with r.pipeline(transaction=False) as pipe:
            for j in ids:
                pipe.hmget(keys.job(j).meta, "version", "terminal")
            heads = await pipe.execute()
        changed, finished = [], []
        for j, (version, terminal) in zip(ids, heads, strict=True):
            if version is None:
                counts["vanished"] += j in self.written  # lost from Redis: kept for reconcile
                continue
            if str(terminal) == "1":
                finished.append(j)
            elif self.written.get(j) != int(version):
                changed.append(j)
        rows = []
        if changed:
            async with r.pipeline(transaction=False) as pipe:
                for j in changed:
                    pipe.hgetall(keys.job(j).meta)
                    pipe.hgetall(keys.job(j).pauses)
                got = await pipe.execute()
            for i, j in enumerate(changed):
                meta, pauses = got[2 * i], got[2 * i + 1]
                if meta and meta.get("terminal") != "1":
                    rows.append((j, meta, pauses))
        if rows or finished:
            await asyncio.to_thread(self._write, rows, finished)
        for j, meta, _ in rows:
            self.written[j] = int(meta["version"])
        for j in finished:
            self.written.pop(j, None)
        counts["mirrored"] += len(rows)
        counts["finished"] += len(finished)
        return counts

    def _write(self, rows: list[tuple[str, dict[str, str], dict[str, str]]], finished: list[str]) -> None:
        now = datetime.now(UTC)
        with self.archive.transaction() as s:
            for j, meta, pauses in rows:
                version = int(meta["version"])
                row = s.get(LiveMirror, j)
                if row is None:
                    s.add(
                        LiveMirror(
                            job_id=j, version=version, status=meta["status"], meta=meta, pauses=pauses, mirrored_at=now
                        )
                    )
                elif row.version <= version:
                    row.version, row.status, row.meta, row.pauses, row.mirrored_at = (
                        version,
                        meta["status"],
                        meta,
                        pauses,
                        now,
                    )
            if finished:
                s.execute(delete(LiveMirror).where(LiveMirror.job_id.in_(finished)))


async def reconcile(store: Any, archive: Archive) -> dict[str, Any]:
    """Restore every mirrored job Redis lost: ``{"counts": {outcome: n}, "jobs": [{job_id, status,
    version, outcome}]}``; outcomes ``RESTORED``, ``PRESENT`` (Redis holds it), ``ARCHIVED`` (it
    finished: the archive has it), ``NOTHING_TO_RUN``."""

    def load() -> tuple[list[LiveMirror], set[str]]:
        with archive.reading() as s:
            rows = list(s.scalars(select(LiveMirror).order_by(LiveMirror.job_id)))
            ids = [r.job_id for r in rows]
            done = set(s.scalars(select(ArchivedJob.job_id).where(ArchivedJob.job_id.in_(ids)))) if ids else set()
            for r in rows:
                s.expunge(r)
            return rows, done

    rows, archived = await asyncio.to_thread(load)
    out: list[dict[str, Any]] = []
    for row in rows:
        if row.job_id in archived:
            outcome = "ARCHIVED"
        elif await store.r.exists(keys.job(row.job_id).meta):
            outcome = "PRESENT"
        else:
            outcome = await restore(store, dict(row.meta), dict(row.pauses))
        out.append({"job_id": row.job_id, "status": row.status, "version": row.version, "outcome": outcome})
        if outcome == "RESTORED":
            log.warning(
                "reconcile: restored job=%s (%s, v%d) from the live mirror", row.job_id, row.status, row.version
            )
    counts = Counter(j["outcome"] for j in out)
    return {"counts": dict(counts), "jobs": out}
