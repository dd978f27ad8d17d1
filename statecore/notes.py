"""Flags, skips and comments (docs/protocol.md § Flags, skips and comments): what a reviewer notes on
a job without deciding it. A mixin of :class:`statecore.store.Store`.

Like a claim, a note is apart from the job: the job's ``notes`` HASH (its flag, and each reviewer's
skip with when it lapses) and ``comments`` LIST, in the job's hash slot, written by notes.lua with
the job's audit entry (and, for flags and comments, an event) in one atomic step. No note changes
the job's version, its pause or its status, so a reviewer with the job open is never sent a 409 by
somebody's flag or comment. The notes are kept for the records' retention and a day, renewed by
each note; the audit log keeps every one of them for as long as the job's records are kept.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from . import keys
from .ids import now_iso
from .models import JobComment, JobFlag

SKIP_FIELD = "skip:"
COMMENTS_SHOWN = 50  # the latest comments a snapshot carries


class NotesMixin:
    r: Any
    _scripts: dict[str, Any]
    config: Any  # statecore.store.StoreConfig: retention_s
    _args: Any  # Store._args
    _raise_for: Any  # Store._raise_for

    async def _note(self, job_id: str, who: str, op: str, text: str = "", until_ms: int = 0) -> str:
        jk = keys.job(job_id)
        keep_ms = int((self.config.retention_s + 24 * 3600) * 1000)
        res = await self._scripts["notes"](
            keys=jk.for_script() + [jk.notes, jk.comments],
            args=self._args(job_id, now_iso(), who) + [op, text, keep_ms, until_ms],
        )
        if res[0] in ("OK", "NONE"):
            return str(res[0])
        self._raise_for(res, job_id)
        raise AssertionError(f"notes.lua answered {res[0]!r}")  # pragma: no cover - every code is mapped

    async def flag(self, job_id: str, who: str, reason: str) -> JobFlag:
        """Flag a waiting job for a lead; a second flag replaces the first (the latest reason shows)."""
        await self._note(job_id, who, "flag", reason)
        flag = await self.flag_of(job_id)
        assert flag is not None
        return flag

    async def unflag(self, job_id: str, who: str) -> bool:
        """Take the flag off a live job: False when it had none."""
        return await self._note(job_id, who, "unflag") == "OK"

    async def comment(self, job_id: str, who: str, text: str) -> JobComment:
        await self._note(job_id, who, "comment", text)
        comments = await self.comments_of(job_id, 1)
        return comments[-1]

    async def skip(self, job_id: str, who: str, for_s: float) -> str:
        """Release ``who``'s claim on a waiting job and pass it over in their next-job query for
        ``for_s`` seconds; the job stays waiting for everyone else. Returns until when (ISO-8601)."""
        until = time.time() + for_s
        await self._note(job_id, who, "skip", until_ms=int(until * 1000))
        return now_iso(until)

    async def flag_of(self, job_id: str) -> JobFlag | None:
        raw = await self.r.hget(keys.job(job_id).notes, "flag")
        return JobFlag.model_validate_json(raw) if raw else None

    async def comments_of(self, job_id: str, last: int = COMMENTS_SHOWN) -> list[JobComment]:
        raw = await self.r.lrange(keys.job(job_id).comments, -last, -1)
        return [JobComment.model_validate(orjson.loads(c)) for c in raw]

    async def notes_of(self, job_ids: list[str], reviewer: str | None) -> list[tuple[JobFlag | None, bool]]:
        """Each job's flag, and whether ``reviewer`` skipped it and the skip still holds: one round trip."""
        now_ms = time.time() * 1000
        async with self.r.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hmget(keys.job(job_id).notes, "flag", SKIP_FIELD + (reviewer or ""))
            rows = await pipe.execute()
        out: list[tuple[JobFlag | None, bool]] = []
        for flag, skip in rows:
            skipped = reviewer is not None and skip is not None and float(skip) > now_ms
            out.append((JobFlag.model_validate_json(flag) if flag else None, skipped))
        return out
