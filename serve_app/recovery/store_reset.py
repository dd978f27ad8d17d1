"""Noticing a Redis that came back empty, and reporting what it lost (docs/protocol.md § Redis
outages).

The dispatcher's watch remembers the store identity it first saw and, every inspector period,
what the store held (jobs per status, the live jobs' ids). When the identity changes, the jobs it
last saw are gone: the report names them, is written to ``<data-dir>/incidents/`` (so it outlives
Redis), logged as an error and counted (``hitl_store_resets_total``). The service goes on with the
empty store; restoring the lost jobs is the archive's work.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from hitl_review.statecore import identity
from hitl_review.statecore.ids import now_iso

from ..observability import metrics

log = logging.getLogger("hitl.store_reset")


class ResetWatch:
    def __init__(self, store: Any, data_dir: Path | None, who: str) -> None:
        self.store = store  # its ``r``: the Redis client (a Store or anything with one)
        self.dir = data_dir / "incidents" if data_dir is not None else None
        self.who = who
        self.known: str | None = None
        self.last_seen: dict[str, Any] | None = None
        self.reports: list[dict[str, Any]] = []  # what this process reported (newest last)

    async def check(self) -> dict[str, Any] | None:
        """Look once: the reset report when the store's identity changed since the last look."""
        now = await identity.ensure(self.store.r)
        report = None
        if self.known is not None and now != self.known:
            report = self._report(now)
        self.known = now
        self.last_seen = await identity.seen(self.store.r)
        return report

    def _report(self, now: str) -> dict[str, Any]:
        before = self.last_seen or {}
        report = {
            "incident": "STORE_RESET",
            "detected_at": now_iso(),
            "detected_by": self.who,
            "previous_store_id": self.known,
            "store_id": now,
            "last_seen": before,
            "lost_jobs": sum((before.get("jobs_by_status") or {}).values()),
        }
        path = self._write(report)
        metrics.STORE_RESETS.inc()
        live = before.get("live_jobs") or {}
        log.error(
            "Redis came back empty (store identity %s -> %s): %d jobs it held at %s are gone "
            "(%s; live: %d waiting on a person, %d queued, %d running)%s",
            self.known,
            now,
            report["lost_jobs"],
            before.get("at", "?"),
            ", ".join(f"{k} {v}" for k, v in sorted((before.get("jobs_by_status") or {}).items())) or "none",
            len(live.get("waiting", [])),
            len(live.get("queued", [])),
            len(live.get("running", [])),
            f"; report {path}" if path else "",
        )
        self.reports.append(report)
        return report

    def _write(self, report: dict[str, Any]) -> Path | None:
        return write_incident(self.dir, "store-reset", self.who, report)


def write_incident(folder: Path | None, kind: str, who: str, report: dict[str, Any]) -> Path | None:
    """``report`` as ``<folder>/<kind>-<stamp>-<who>.json`` (fsynced, renamed into place; it must
    outlive Redis and this process), its path added as ``report_path``; None without a folder."""
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    stamp = now_iso().replace(":", "").replace("-", "")
    path = folder / f"{kind}-{stamp}-{who}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("w") as f:
        json.dump(report, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    report["report_path"] = str(path)
    return path
