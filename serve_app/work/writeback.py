"""Write-back of node results with layered retries (docs/protocol.md § Executors and the outbox).

A model's result that cannot be applied because Redis is unreachable is not lost, and the model
is not run again: the report is first kept in a spool file of the data directory
(``<data-dir>/spool/<node_instance_id>.json``, written atomically: temp file, fsync, rename),
then applied again at once, after 1 s, then after gaps that double, each capped by the node
type's maximum execution time; between two attempts Redis is probed every second and the next
attempt comes as soon as it answers. The attempt made once that maximum time has passed since
the first failure is the last: the report then becomes a dead letter (``statecore.deadletters``),
written when Redis is back. The spool file is deleted once Redis took the report (``OK``,
``DUPLICATE`` and ``IGNORED`` all count as applied) or its dead letter. A spool left by an
earlier process (a replica restart) is resumed when the dispatcher starts.

Each report that needed the spool counts once in ``writeback_failures`` (``/metrics``), in Redis,
when it is settled; while it waits, this process's ``hitl_writeback_spooled`` gauge counts it (the
alert that must fire while Redis is down reads that).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hitl_review.statecore import counters, deadletters
from hitl_review.statecore.durable import reraise_if_cancelled, store_unavailable
from hitl_review.statecore.models import NodeReport
from hitl_review.statecore.outbox import OutboxEntry
from hitl_review.statecore.store import Store

from ..observability import metrics

log = logging.getLogger("hitl.writeback")

# "Redis is away" is what ``statecore.durable.store_unavailable`` says it is (down, hung, loading,
# without a master, read-only, out of memory, MISCONF, BUSY): the same errors the API answers 503
# for. Any other error is a bug and propagates.
FIRST_GAP_S = 1.0
PROBE_S = 1.0
DEAD_REASON = "WRITE_BACK_FAILED"


@dataclass
class Spooled:
    """One report waiting in the spool, with where its retries stand."""

    report: dict[str, Any]
    first_failed_at: float  # wall clock (s): the schedule survives a restart
    attempts: int = 1
    error: str = ""
    stream: str | None = None  # the outbox entry to acknowledge once settled
    entry_id: str | None = None
    dead: bool = False  # the last retry failed: waiting to be written as a dead letter

    @property
    def node_report(self) -> NodeReport:
        return NodeReport.model_validate(self.report)


class WriteBack:
    """Applies node reports for a dispatcher; see the module's docstring."""

    def __init__(self, store: Store, data_dir: Path | None, *, first_gap_s: float = FIRST_GAP_S) -> None:
        self.store = store
        self.spool_dir = data_dir / "spool" if data_dir is not None else None
        self.first_gap_s = first_gap_s
        self._active: set[str] = set()  # node_instance_ids being retried by this process

    # ------------------------------------------------------------------ applying

    async def apply(self, report: NodeReport, entry: OutboxEntry | None = None) -> str:
        """Apply ``report`` and acknowledge ``entry``: the store's answer, or ``DEAD_LETTER``."""
        try:
            result = await self.store.apply_report(report)
        except Exception as e:
            if not store_unavailable(e):
                raise
            rec = Spooled(
                report=report.model_dump(mode="json"),
                first_failed_at=time.time(),
                error=f"{type(e).__name__}: {e}",
                stream=entry.stream if entry else None,
                entry_id=entry.entry_id if entry else None,
            )
            await self._save(rec)
            log.warning(
                "write-back of node=%s job=%s failed (%s): spooled, retrying", report.node_instance_id, report.job_id, e
            )
            return await self._retry(rec)
        if entry is not None:
            await self.store.outbox_ack(entry)
        return result

    async def resume(self) -> None:
        """Take up the spool an earlier process left (at dispatcher start)."""
        if self.spool_dir is None or not self.spool_dir.is_dir():
            return
        recs = []
        for path in sorted(self.spool_dir.glob("*.json")):
            try:
                recs.append(Spooled(**json.loads(path.read_text())))
            except (ValueError, TypeError) as e:
                log.error("unreadable spool file %s left in place: %s", path, e)
        recs = [r for r in recs if r.report.get("node_instance_id") not in self._active]
        if recs:
            log.warning("resuming %d spooled write-back(s) from %s", len(recs), self.spool_dir)
        await asyncio.gather(*(self._retry(r) for r in recs), return_exceptions=True)

    def spooled(self) -> list[str]:
        """The node_instance_ids with a spool file (for checks and tests)."""
        if self.spool_dir is None or not self.spool_dir.is_dir():
            return []
        return sorted(p.stem for p in self.spool_dir.glob("*.json"))

    # ------------------------------------------------------------------ the retries

    async def _retry(self, rec: Spooled) -> str:
        report = rec.node_report
        nid = report.node_instance_id
        self._active.add(nid)
        metrics.WRITEBACK_SPOOLED.inc()  # per process: visible while Redis is down
        try:
            max_s = self.store.config.max_execution_s(report.node_type)
            gap = self.first_gap_s
            while not rec.dead:
                try:  # at once after spooling (or resuming), then after each gap
                    # First say so in Redis: the inspector leaves the node alone meanwhile.
                    await self.store.mark_writeback(report.job_id, nid)
                    return await self._settle(rec, await self.store.apply_report(report))
                except Exception as e:
                    if not store_unavailable(e):
                        raise
                    reraise_if_cancelled(e)
                    rec.error = f"{type(e).__name__}: {e}"
                rec.attempts += 1
                if time.time() - rec.first_failed_at >= max_s:
                    rec.dead = True
                    log.error("write-back of node=%s job=%s: last retry failed, a dead letter", nid, report.job_id)
                await self._save(rec)
                if not rec.dead:
                    await self._until_next(gap)
                    gap = min(gap * 2, max_s)
            while True:
                try:
                    await deadletters.add(
                        self.store.r,
                        job_id=report.job_id,
                        kind="report",
                        reason=f"{DEAD_REASON}: {rec.attempts} attempts; last error {rec.error}",
                        payload=rec.report,
                    )
                    return await self._settle(rec, "DEAD_LETTER")
                except Exception as e:
                    if not store_unavailable(e):
                        raise
                    reraise_if_cancelled(e)
                    await self._until_next(min(max(gap, self.first_gap_s), max_s))
        finally:
            self._active.discard(nid)
            metrics.WRITEBACK_SPOOLED.dec()

    async def _settle(self, rec: Spooled, result: str) -> str:
        report = rec.node_report
        await counters.incr(self.store.r, report.job_id, "writeback_failures")
        if rec.stream and rec.entry_id:
            try:
                cmd: Any = None  # the entry's command is not needed to acknowledge it
                await self.store.outbox_ack(OutboxEntry(rec.stream, rec.entry_id, cmd))
            except Exception as e:  # left pending: a reclaim finds the node no longer current and acks it
                if not store_unavailable(e):
                    raise
        try:
            await self.store.clear_writeback(report.job_id, report.node_instance_id)
        except Exception as e:  # it expires by itself
            if not store_unavailable(e):
                raise
        await asyncio.to_thread(self._unlink, report.node_instance_id)
        log.warning(
            "write-back of node=%s job=%s settled after %d attempt(s): %s",
            report.node_instance_id,
            report.job_id,
            rec.attempts,
            result,
        )
        return result

    async def _until_next(self, gap: float) -> None:
        """Sleep ``gap`` seconds, or less: as soon as Redis answers a PING (probed every second)."""
        end = time.monotonic() + gap
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(PROBE_S, left))
            try:
                if await asyncio.wait_for(self.store.r.ping(), PROBE_S):
                    return
            except Exception as e:  # a PING that times out, or one a BUSY or MISCONF Redis refuses
                if not (isinstance(e, TimeoutError) or store_unavailable(e)):
                    raise

    # ------------------------------------------------------------------ the spool

    async def _save(self, rec: Spooled) -> None:
        if self.spool_dir is not None:
            await asyncio.to_thread(self._write, rec)

    def _write(self, rec: Spooled) -> None:
        assert self.spool_dir is not None
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        nid = rec.node_report.node_instance_id
        final = self.spool_dir / f"{nid}.json"
        tmp = self.spool_dir / f".{nid}.json.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(rec), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        dir_fd = os.open(self.spool_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself is on disk
        finally:
            os.close(dir_fd)

    def _unlink(self, nid: str) -> None:
        if self.spool_dir is not None:
            (self.spool_dir / f"{nid}.json").unlink(missing_ok=True)
