"""The batch manifest: append-only JSONL, one line per file per step, and what a rerun does with a
file given its last line (submit it, wait for its job, download its outputs again, or nothing)."""

from __future__ import annotations

import enum
import json
import os
import threading
from pathlib import Path
from typing import Any

from .waiting import TERMINAL_STATUSES


class Manifest:
    """Append-only JSONL, one line per file per step; on load the last line of a (path, key) wins.

    Lines are flushed as written, so a killed run loses at most the step it was
    in; a torn last line is ignored on load.
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._fh: Any = None

    @staticmethod
    def _key(path: str, idem_key: str) -> str:
        return f"{path}\0{idem_key}"

    def load(self) -> dict[str, dict[str, Any]]:
        records: dict[str, dict[str, Any]] = {}
        if self.path is None or not self.path.exists():
            return records
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("path"), str) and rec.get("idempotency_key"):
                    records[self._key(rec["path"], rec["idempotency_key"])] = rec
        return records

    @classmethod
    def lookup(cls, records: dict[str, dict[str, Any]], path: Path, idem_key: str) -> dict[str, Any] | None:
        return records.get(cls._key(str(path.resolve()), idem_key))

    def append(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n"
        with self._lock:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "a", encoding="utf-8")
            self._fh.write(line)
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


class Action(enum.Enum):
    SUBMIT = "submit"  # not in the manifest (or never accepted): send it
    WAIT = "wait"  # accepted earlier and not known to be finished: follow the job, don't resend
    DOWNLOAD = "download"  # finished earlier but its output directory is incomplete: fetch results again
    DONE = "done"  # finished earlier (and its outputs are there): nothing to do


def resume_action(record: dict[str, Any] | None, *, wait: bool, out_dir: Path | None) -> Action:
    """What a rerun does with a file, given its last manifest record."""
    if not record or not record.get("job_id"):
        return Action.SUBMIT
    if record.get("final_status") in TERMINAL_STATUSES:
        if wait and out_dir is not None and not (out_dir / "results.json").exists():
            return Action.DOWNLOAD
        return Action.DONE
    return Action.WAIT
