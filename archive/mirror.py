"""The live mirror and reconcile (docs/protocol.md § Reconcile).

Redis stays the only place where a pause is consumed; the archive keeps, asynchronously, what each
live job looked like (its meta hash and pause history, as Redis holds them) so that a Redis that
lost live jobs (a restart without persistence, a failover to an empty replica) can be given them
back. :class:`Mirror` runs in the archiver's loop (``serve_app.work.archive_loop``) once per inspector
period over the partitions whose archiver lease it holds (never on the intervention's path): it
reads the live indexes and the mirror's own rows of those partitions, and writes the jobs whose
version moved since it last wrote them. The rows are read back from the database, not from the
process's memory: a job that ends across a restart of the archiver or a move of its lease still
gets its row marked as ended, and a row stays until the archive holds the job's copy (then it is
dropped: the copy is the record). A job that vanished from Redis keeps its row: that is what
reconcile restores.

:func:`reconcile` restores every mirrored job Redis does not hold and nothing says has ended
(``statecore.restore``): a fresh pause for a waiting job (the old token refused), the node queued
again for a job in model work; a consumed pause is never reopened, and a job that ever reached a
terminal state (its row, its archive copy or its archived audit says so) never moves again.

:func:`write_live` is the one place a row is written (version-ordered, never back);
:func:`mirror_now` writes one job's row at once, for a caller that cannot wait for the next period
(the API under ``--durability strict``, right after an intervention).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from hitl_review.statecore import keys
from hitl_review.statecore.restore import restore
from hitl_review.statecore.states import TERMINAL

from .db import Archive
from .schema import ArchivedJob, AuditEntry, LiveMirror

log = logging.getLogger("hitl.mirror")

LIVE = (keys.waiting, keys.queued, keys.running)
TERMINAL_STATUSES = frozenset(s.value for s in TERMINAL)
# Audit outcomes that only a job that ended records (docs/protocol.md § Audit): a cancel, a refusal
# because the job had ended, a report that ended it.
TERMINAL_OUTCOMES = frozenset(
    {"CANCELLED", "ALREADY_CANCELLED", "REFUSED:JOB_TERMINAL"} | {f"APPLIED:{s}" for s in TERMINAL_STATUSES}
)
ATTEMPTS = 3  # two writers inserting one job's first row at once (the mirror and mirror_now): the loser retries

Row = tuple[str, dict[str, str], dict[str, str], dict[str, Any]]  # job, meta, pauses, records


def ended(meta: dict[str, Any]) -> bool:
    """Whether a mirrored meta is a finished job's (a row restore must never bring back)."""
    return str(meta.get("terminal")) == "1" or meta.get("status") in TERMINAL_STATUSES


def _put(s: Session, row: Row, now: datetime) -> None:
    """Upsert one row, version-ordered: a row never goes back to an older version, so a late
    writer holding an older read (the periodic mirror racing the journal) changes nothing. At the
    same version (a quorum vote records itself without moving the version) the intervention records
    only grow: a late writer that read before a vote keeps the row that has it."""
    job_id, meta, pauses, records = row
    version = int(meta["version"])
    found = s.get(LiveMirror, job_id, with_for_update=True)
    if found is None:
        s.add(
            LiveMirror(
                job_id=job_id,
                version=version,
                status=meta["status"],
                meta=meta,
                pauses=pauses,
                records=records,
                submitter=meta.get("submitter") or None,
                idem_key=meta.get("idem_key") or None,
                mirrored_at=now,
            )
        )
        return
    if found.version > version:
        return
    if found.version == version:
        kept = (found.records or {}).get("idem") or {}
        if len(kept) > len(records.get("idem") or {}):
            return  # an older read of this version: it misses a vote the row has
    found.version, found.status, found.meta, found.pauses, found.mirrored_at = (
        version,
        meta["status"],
        meta,
        pauses,
        now,
    )
    found.records = records
    found.submitter, found.idem_key = meta.get("submitter") or None, meta.get("idem_key") or None


def _write_rows(archive: Archive, rows: list[Row], drop: Iterable[str] = ()) -> None:
    """``rows`` upserted and the rows of ``drop`` deleted, in one transaction (retried when another
    writer inserted one of the rows first)."""
    gone = list(drop)
    for attempt in range(ATTEMPTS):
        try:
            with archive.transaction() as s:
                now = datetime.now(UTC)
                for row in rows:
                    _put(s, row, now)
                if gone:
                    s.execute(delete(LiveMirror).where(LiveMirror.job_id.in_(gone)))
            return
        except IntegrityError:
            if attempt == ATTEMPTS - 1:
                raise


async def read_rows(r: Any, job_ids: list[str]) -> list[Row]:
    """The mirror rows of ``job_ids`` as Redis holds them now: meta, pause history, intervention
    records and, for a job created under an ``Idempotency-Key``, its creation record (two round
    trips). A job Redis does not hold is left out."""
    if not job_ids:
        return []
    async with r.pipeline(transaction=False) as pipe:
        for j in job_ids:
            jk = keys.job(j)
            pipe.hgetall(jk.meta)
            pipe.hgetall(jk.pauses)
            pipe.hgetall(jk.idem)
        got = await pipe.execute()
    found = [(j, got[3 * i], got[3 * i + 1], got[3 * i + 2]) for i, j in enumerate(job_ids) if got[3 * i]]
    keyed = [
        (i, keys.create_idem(m["submitter"], m["idem_key"]))
        for i, (_, m, _, _) in enumerate(found)
        if m.get("idem_key")
    ]
    creates: dict[int, dict[str, str]] = {}
    if keyed:
        async with r.pipeline(transaction=False) as pipe:
            for _, key in keyed:
                pipe.hgetall(key)
            creates = {i: rec for (i, _), rec in zip(keyed, await pipe.execute(), strict=True) if rec}
    rows: list[Row] = []
    for i, (j, meta, pauses, idem) in enumerate(found):
        records: dict[str, Any] = {"idem": idem}
        if i in creates:
            records["create"] = creates[i]
        rows.append((j, meta, pauses, records))
    return rows


def write_live(
    archive: Archive, job_id: str, meta: dict[str, str], pauses: dict[str, str], records: dict[str, Any] | None = None
) -> None:
    """Write one job's row from its Redis meta, pause history and records (synchronous: the
    archive's engine is; an async caller goes through ``asyncio.to_thread``). A finished job's meta
    is written too: its row is then the proof that the job ended, until the archive holds its copy."""
    _write_rows(archive, [(job_id, meta, pauses, records or {})])


async def mirror_now(store: Any, archive: Archive, job_id: str) -> int | None:
    """Mirror ``job_id`` at once, from Redis as it is now; the version written, or None for a job
    Redis does not hold (its row is left as it is)."""
    rows = await read_rows(store.r, [job_id])
    if not rows:
        return None
    await asyncio.to_thread(_write_rows, archive, rows)
    return int(rows[0][1]["version"])


class Mirror:
    """One archiver's mirror: what it wrote last (job id → version and number of intervention
    records: a quorum vote adds one without moving the version), so an unchanged live job costs
    one HMGET and one HLEN per period and nothing written in the database. What it wrote is only a cache: the
    rows of its partitions are read back each period, so a row another process (or an earlier run
    of this one) wrote is followed too."""

    def __init__(self, store: Any, archive: Archive) -> None:
        self.store = store
        self.archive = archive
        self.written: dict[str, tuple[int, int]] = {}  # job -> (version, intervention records) written
        self.vanished: list[str] = []  # the last pass's: followed jobs Redis no longer holds (lost)
        # The last pass's: for each live job it wrote, how long its change had waited (updated_at to now), s.
        self.lags: list[float] = []

    def _rows(self, parts: set[int]) -> tuple[set[str], list[str]]:
        """The mirror's rows of ``parts``: those not yet marked ended (to follow), and those whose
        job the archive holds (obsolete: the copy is the record)."""
        with self.archive.reading() as s:
            found = s.execute(
                select(LiveMirror.job_id, LiveMirror.status, ArchivedJob.job_id).outerjoin(
                    ArchivedJob, ArchivedJob.job_id == LiveMirror.job_id
                )
            ).all()
        follow: set[str] = set()
        obsolete: list[str] = []
        for j, status, archived in found:
            if keys.partition_of(j) not in parts:
                continue
            if archived is not None:
                obsolete.append(j)
            elif status not in TERMINAL_STATUSES:
                follow.add(j)
        return follow, obsolete

    async def sync(self, partitions: Iterable[int]) -> Counter[str]:
        counts: Counter[str] = Counter()
        r = self.store.r
        parts = set(partitions)
        async with r.pipeline(transaction=False) as pipe:
            for p in sorted(parts):
                for index in LIVE:
                    pipe.zrange(index(p), 0, -1)
            res = await pipe.execute()
        # Index members name a job, or one of its subject nodes (``<job_id>|<node id>``).
        live = {keys.split_member(j if isinstance(j, str) else j.decode())[0] for ids in res for j in ids}
        follow, obsolete = await asyncio.to_thread(self._rows, parts)
        known = follow | {j for j in self.written if keys.partition_of(j) in parts}
        ids = sorted(live) + sorted(known - live)
        async with r.pipeline(transaction=False) as pipe:
            for j in ids:
                pipe.hmget(keys.job(j).meta, "version", "terminal")
                pipe.hlen(keys.job(j).idem)
            got = await pipe.execute()
        heads = [(got[2 * i][0], got[2 * i][1], int(got[2 * i + 1])) for i in range(len(ids))]
        changed = []
        self.vanished = [j for j, (version, _, _) in zip(ids, heads, strict=True) if version is None and j in known]
        for j, (version, terminal, records) in zip(ids, heads, strict=True):
            if version is None:
                counts["vanished"] += j in known  # lost from Redis: kept for the recovery (reconcile)
            elif str(terminal) == "1":
                if j in known:  # its row must say it ended; a job never mirrored needs no row
                    changed.append(j)
            elif self.written.get(j) != (int(version), records):  # moved, or a vote recorded itself
                changed.append(j)
        rows = await read_rows(r, changed)
        if rows or obsolete:
            await asyncio.to_thread(_write_rows, self.archive, rows, obsolete)
        now = datetime.now(UTC)
        self.lags = [
            (now - datetime.fromisoformat(m["updated_at"])).total_seconds()
            for _, m, _, _ in rows
            if m.get("updated_at")
        ]
        for j, meta, _, recs in rows:
            if ended(meta):
                self.written.pop(j, None)
                counts["finished"] += 1
            else:
                self.written[j] = (int(meta["version"]), len(recs["idem"]))
                counts["mirrored"] += 1
        for j in obsolete:
            self.written.pop(j, None)
        counts["dropped"] += len(obsolete)
        return counts


async def reconcile(
    store: Any, archive: Archive, job_ids: Iterable[str] | None = None, actor: str = "reconcile"
) -> dict[str, Any]:
    """Restore every mirrored job Redis lost (of ``job_ids`` only, when given): ``{"counts":
    {outcome: n}, "jobs": [{job_id, status, version, outcome}]}``; outcomes ``RESTORED``, ``PRESENT``
    (Redis holds it), ``ARCHIVED`` (it finished: the archive has it), ``TERMINAL`` (it ended, though
    the archive has no copy: its row says so, or its archived audit does), ``NOTHING_TO_RUN``. A job
    that ended is never restored, whatever its row last said: a cancelled job never moves again.
    ``actor``: whom a restored job's first audit entry names (an admin's reconcile, or the automatic
    recovery: ``serve_app.recovery.recovery``)."""
    only = None if job_ids is None else sorted(set(job_ids))

    def load() -> tuple[list[LiveMirror], set[str], set[str]]:
        with archive.reading() as s:
            query = select(LiveMirror).order_by(LiveMirror.job_id)
            if only is not None:
                query = query.where(LiveMirror.job_id.in_(only))
            rows = list(s.scalars(query))
            ids = [r.job_id for r in rows]
            done: set[str] = set()
            audited: set[str] = set()
            if ids:
                done = set(s.scalars(select(ArchivedJob.job_id).where(ArchivedJob.job_id.in_(ids))))
                audited = set(
                    s.scalars(
                        select(AuditEntry.job_id)
                        .where(AuditEntry.job_id.in_(ids), AuditEntry.outcome.in_(TERMINAL_OUTCOMES))
                        .distinct()
                    )
                )
            for r in rows:
                s.expunge(r)
            return rows, done, audited

    rows, archived, audited = await asyncio.to_thread(load)
    out: list[dict[str, Any]] = []
    for row in rows:
        if row.job_id in archived:
            outcome = "ARCHIVED"
        elif row.status in TERMINAL_STATUSES or ended(row.meta) or row.job_id in audited:
            outcome = "TERMINAL"
        elif await store.r.exists(keys.job(row.job_id).meta):
            outcome = "PRESENT"
        else:
            outcome = await restore(store, dict(row.meta), dict(row.pauses), dict(row.records or {}), actor=actor)
        out.append({"job_id": row.job_id, "status": row.status, "version": row.version, "outcome": outcome})
        if outcome == "RESTORED":
            log.warning(
                "%s: restored job=%s (%s, v%d) from the live mirror", actor, row.job_id, row.status, row.version
            )
    counts = Counter(j["outcome"] for j in out)
    return {"counts": dict(counts), "jobs": out}
