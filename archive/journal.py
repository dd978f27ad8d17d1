"""The journal of ``--durability strict`` (docs/protocol.md § Redis outages): what a client was told,
or could have read, is in the archive's live mirror before it is told or read, so a Redis that comes
back empty gives it back (SPEC §11).

Every store write a client can observe (a creation, an intervention or vote, a cancel, a model
report, the inspector's verdicts, a restore: ``statecore.durable.JOURNALED``) is followed, before
the write's caller goes on, by :meth:`Journal.__call__`: the job's row written from Redis as it is
now (``archive.mirror.read_rows``: meta, pause history, intervention and creation records), then the
meta's ``mirrored`` set to the version written (``mark_mirrored.lua``). Reads close the last window:
a job read at a version the mirror does not hold yet (a reader that raced the writer between its
Redis commit and its journal) is journaled by ``Store.journal_behind`` before it is answered.

A journal that cannot write raises ``StoreUnavailable``: the API answers 503 and the client retries;
its retry is answered as a replay, and the replay's answer journals again (a write whose journal
failed is journaled by the next answer that names it, or by the periodic mirror). A model report whose
journal failed is retried by the dispatcher's write-back the same way (``DUPLICATE`` journals).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hitl_review.statecore import errors, keys

from . import mirror
from .db import Archive

log = logging.getLogger("hitl.journal")


class Journal:
    """``store.journal`` under ``--durability strict`` with an archive (serve_app.recovery.durability.configure)."""

    def __init__(self, archive: Archive, on_error: Any = None, on_write: Any = None) -> None:
        self.archive = archive
        self.on_error = on_error  # called with the exception (a metric), when set
        self.on_write = on_write  # called with the seconds a write took (a metric), when set

    async def __call__(self, store: Any, job_id: str, *, changed: bool = True) -> None:
        """The job's row as Redis holds it now. ``changed``: the caller's script changed the job
        (always journal); False for a replay, journaled only when an earlier journal of it failed."""
        if not changed and await self._mirrored(store, job_id):
            return
        t0 = time.perf_counter()
        try:
            version = await mirror.mirror_now(store, self.archive, job_id)
            if version is not None:
                await store._scripts["mark_mirrored"](keys=[keys.job(job_id).meta], args=[version])
        except Exception as e:
            if self.on_error is not None:
                self.on_error(e)
            log.error("journal: job=%s not in the live mirror: %s: %s", job_id, type(e).__name__, e)
            raise errors.StoreUnavailable(
                f"the change is recorded in Redis but not yet in the archive ({type(e).__name__}); retry with "
                "the same request: it is answered as a replay",
                job_id=job_id,
            ) from e
        if self.on_write is not None:
            self.on_write(time.perf_counter() - t0)

    async def _mirrored(self, store: Any, job_id: str) -> bool:
        version, mirrored = await store.r.hmget(keys.job(job_id).meta, "version", "mirrored")
        return version is None or (mirrored is not None and int(mirrored) >= int(version))


def attach(store: Any, archive: Archive | None, durability: str, **hooks: Any) -> Journal | None:
    """Give ``store`` the journal when ``durability`` is strict and there is an archive; the journal, or None."""
    if durability != "strict" or archive is None:
        store.journal = None
        return None
    journal = Journal(archive, **hooks)
    store.journal = journal
    return journal
