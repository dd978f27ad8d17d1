"""``HitlClient``'s flags, skips and comments (docs/protocol.md § Flags, skips and comments): ways
out of a job that do not end it. The requests are written once as plans over ``ClientCore`` (as
``client.core`` does for the others); ``NoteCalls`` runs them for the synchronous client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hitl_review.statecore.models import JobComment, JobFlag, JobList

from .core import ClientCore
from .retry import RetryMode
from .steps import Plan
from .wire import API, job_path


def flag_plan(core: ClientCore, job_id: str, reason: str) -> Plan[JobFlag]:
    resp = yield from core.call("POST", job_path(job_id, "/flag"), json={"reason": reason})
    return JobFlag.model_validate_json(resp.content)


def unflag_plan(core: ClientCore, job_id: str) -> Plan[bool]:
    resp = yield from core.call("DELETE", job_path(job_id, "/flag"))
    return bool(resp.json()["removed"])


def comment_plan(core: ClientCore, job_id: str, text: str) -> Plan[JobComment]:
    # Only a request that never left is retried: a second one would post the comment twice.
    resp = yield from core.call("POST", job_path(job_id, "/comments"), json={"text": text}, mode=RetryMode.CONNECT_ONLY)
    return JobComment.model_validate_json(resp.content)


def skip_plan(core: ClientCore, job_id: str, for_s: float | None) -> Plan[dict[str, Any]]:
    body = {"for_s": for_s} if for_s is not None else {}
    resp = yield from core.call("POST", job_path(job_id, "/skip"), json=body)
    answer: dict[str, Any] = resp.json()
    return answer


def flagged_plan(core: ClientCore, limit: int) -> Plan[JobList]:
    params = {"status": "WAITING", "flagged": "true", "limit": limit}
    resp = yield from core.call("GET", f"{API}/jobs", params=params)
    return JobList.model_validate_json(resp.content)


class NoteCalls:
    """A base of ``HitlClient``, which provides ``_core`` and ``_run``."""

    _core: ClientCore
    _run: Callable[[Plan[Any]], Any]

    def flag(self, job_id: str, reason: str) -> JobFlag:
        """Flag the waiting job for a lead, with why; it stays waiting."""
        flagged: JobFlag = self._run(flag_plan(self._core, job_id, reason))
        return flagged

    def unflag(self, job_id: str) -> bool:
        """Take the job's flag off; False when it had none."""
        return bool(self._run(unflag_plan(self._core, job_id)))

    def comment(self, job_id: str, text: str) -> JobComment:
        """A comment on a live job, for the next reviewer (the snapshot's ``comments``)."""
        posted: JobComment = self._run(comment_plan(self._core, job_id, text))
        return posted

    def skip(self, job_id: str, for_s: float | None = None) -> dict[str, Any]:
        """Hand the waiting job back (the claim released); this reviewer's next job passes it over
        for ``for_s`` seconds (the server's default, 600, when None). ``{"job_id", "until"}``."""
        skipped: dict[str, Any] = self._run(skip_plan(self._core, job_id, for_s))
        return skipped

    def flagged_jobs(self, limit: int = 100) -> JobList:
        """The waiting jobs flagged for a lead, oldest pause first."""
        flagged: JobList = self._run(flagged_plan(self._core, limit))
        return flagged
