"""Live jobs (and reviewer accounts) a Redis that came back empty lost, given back without an admin (docs/protocol.md §
Redis outages, § Reconcile; seed 004: a database fallback that refills Redis on a miss, one flight
per job).

Two ways in, both through ``archive.mirror.reconcile`` (so the same refusals: a job that ever ended
is never restored, a consumed pause is never reopened):

- **read-through** (:meth:`Recovery.restore_missing`): the API's store calls it when a job it is
  asked about is not in Redis (``Store.on_missing``). If the archive's live mirror holds the job as
  live, it is restored and the request goes on as if nothing happened. One restore per job at a
  time in this process (concurrent requests wait for the same one); across processes
  ``restore_job.lua`` lets only the first write (the others find the job PRESENT).
- **sweep** (:meth:`Recovery.restore_lost`): each mirror pass of the archiver
  (``serve_app.work.archive_loop``) hands over the followed jobs Redis no longer holds; they are restored
  in one reconcile, and an incident report names what was restored and what could not be
  (``<data-dir>/incidents/store-restore-*.json``).

What the mirror did not see is not restored: under ``--durability fast`` the mirror lags by up to one
inspector period, so a job created or decided within it comes back as the mirror last saw it (or
not at all). Under ``--durability strict`` with an archive, the store's journal (archive/journal.py)
writes the job's mirror row with every change before it is answered or read, so what a client was
told is what comes back: a decided review is never offered again, a finished job never works again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hitl_review.statecore import accounts
from hitl_review.statecore.ids import now_iso

from ..observability import metrics
from .store_reset import write_incident

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive

log = logging.getLogger("hitl.recovery")

BACK = ("RESTORED", "PRESENT")  # the job answers again


class Recovery:
    def __init__(self, store: Any, archive: Archive, *, data_dir: Path | None = None, who: str = "api") -> None:
        self.store = store
        self.archive = archive
        self.incidents = data_dir / "incidents" if data_dir is not None else None
        self.who = who
        self._flights: dict[str, asyncio.Task[bool]] = {}
        self._accounts: asyncio.Task[int] | None = None

    async def restore_missing(self, job_id: str) -> bool:
        """Whether ``job_id``, missing from Redis, is there again (restored from the mirror now)."""
        flight = self._flights.get(job_id)
        if flight is None:
            flight = asyncio.get_running_loop().create_task(self._restore_one(job_id))
            self._flights[job_id] = flight
            flight.add_done_callback(lambda _t: self._flights.pop(job_id, None))
        return await asyncio.shield(flight)

    async def _restore_one(self, job_id: str) -> bool:
        from sqlalchemy.exc import SQLAlchemyError

        from hitl_review.archive.mirror import reconcile

        try:
            done = await reconcile(self.store, self.archive, [job_id], actor="recovery")
        except SQLAlchemyError as e:  # the archive unreadable: the job is missing, as before (Redis errors: 503)
            log.warning(
                "recovery: job=%s could not be looked up in the live mirror: %s: %s", job_id, type(e).__name__, e
            )
            return False
        if not done["jobs"]:
            return False  # never mirrored as live: a job that does not exist (or long archived)
        outcome = done["jobs"][0]["outcome"]
        metrics.JOBS_RESTORED.labels("read", outcome).inc()
        if outcome == "RESTORED":
            log.warning("recovery: job=%s was not in Redis; restored from the live mirror on request", job_id)
        return outcome in BACK

    async def restore_lost(self, job_ids: list[str]) -> dict[str, Any] | None:
        """Restore the followed jobs Redis no longer holds; the incident report, or None when there
        was nothing to restore."""
        from hitl_review.archive.mirror import reconcile

        if not job_ids:
            return None
        done = await reconcile(self.store, self.archive, job_ids, actor="recovery")
        outcomes = Counter(j["outcome"] for j in done["jobs"])
        for outcome, n in outcomes.items():
            metrics.JOBS_RESTORED.labels("sweep", outcome).inc(n)
        if not outcomes.get("RESTORED") and not outcomes.get("NOTHING_TO_RUN"):
            return None  # all back already (read-through) or ended: nothing happened here
        report = {
            "incident": "STORE_RESTORE",
            "detected_at": now_iso(),
            "detected_by": self.who,
            "counts": dict(outcomes),
            "restored": [j for j in done["jobs"] if j["outcome"] == "RESTORED"],
            "not_restored": [j for j in done["jobs"] if j["outcome"] not in BACK],
        }
        path = write_incident(self.incidents, "store-restore", self.who, report)
        log.error(
            "Redis had lost %d live jobs: %d restored from the live mirror, %d could not be (%s)%s",
            len(done["jobs"]),
            outcomes.get("RESTORED", 0),
            len(report["not_restored"]),
            ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
            f"; report {path}" if path else "",
        )
        return report

    async def restore_accounts(self) -> int:
        """The reviewer accounts, when Redis lost them all (its accounts hash is gone): written back from
        the archive's copy (``archive.accounts``); how many. One flight at a time in this process."""
        if self._accounts is None:
            self._accounts = asyncio.get_running_loop().create_task(self._restore_accounts())
            self._accounts.add_done_callback(lambda _t: setattr(self, "_accounts", None))
        return await asyncio.shield(self._accounts)

    async def _restore_accounts(self) -> int:
        from hitl_review.archive import accounts as kept_accounts

        if not await accounts.lost(self.store.r):
            return 0
        from sqlalchemy.exc import SQLAlchemyError

        try:
            kept = await asyncio.to_thread(kept_accounts.load_all, self.archive)
        except SQLAlchemyError as e:  # the archive unreadable: the accounts stay lost until the next try
            log.warning("recovery: the archive's reviewer accounts could not be read: %s: %s", type(e).__name__, e)
            return 0
        n = await accounts.restore(self.store, kept)
        if n:
            metrics.ACCOUNTS_RESTORED.inc(n)
            log.error("Redis had lost the reviewer accounts: %d written back from the archive (%s)", n, self.who)
        return n
