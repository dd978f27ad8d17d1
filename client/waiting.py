"""The bookkeeping of ``wait_for``: which statuses end a wait, its deadline, its cancel flag, the
status changes it reports. The plan itself is ``ClientCore.wait_for``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from hitl_review.statecore.models import Event, JobSnapshot
from hitl_review.statecore.states import TERMINAL, JobStatus

from .errors import HitlClientError, WaitTimeout

TERMINAL_STATUSES: frozenset[str] = frozenset(s.value for s in TERMINAL)
POLL_INTERVAL = 1.0
POLL_INTERVAL_MAX = 5.0


class WaitCancelled(HitlClientError):
    """``wait_for`` was told to stop through its ``cancel`` event."""


def wanted_statuses(statuses: Iterable[str] | None) -> frozenset[str]:
    """The statuses ``wait_for`` stops at (default: the terminal ones); ValueError on a name that is no status."""
    if statuses is None:
        return TERMINAL_STATUSES
    return frozenset(str(JobStatus(s)) for s in statuses)


class Waiter:
    """The deadline and status bookkeeping of one ``wait_for``."""

    def __init__(
        self,
        job_id: str,
        wanted: frozenset[str],
        timeout: float,
        on_status: Callable[[str], None] | None,
        cancelled: Callable[[], bool] | None,
    ) -> None:
        self.job_id = job_id
        self.wanted = wanted
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.on_status = on_status
        self.cancelled = cancelled
        self.last_status: str | None = None

    def saw(self, status: str) -> None:
        if status != self.last_status:
            self.last_status = status
            if self.on_status is not None:
                self.on_status(status)

    def done(self, snap: JobSnapshot) -> bool:
        """True when ``snap`` is wanted, or terminal (it will never change again)."""
        self.saw(str(snap.status))
        return snap.status in self.wanted or snap.status in TERMINAL_STATUSES

    def check(self, snap: JobSnapshot | None) -> None:
        if self.cancelled is not None and self.cancelled():
            raise WaitCancelled(f"stopped waiting for job {self.job_id}")
        if time.monotonic() >= self.deadline:
            raise WaitTimeout(self.job_id, self.timeout, snap)

    def worth_a_look(self, event: Event) -> bool:
        """Whether ``event`` may mean the wait is over (a GET then decides: history can be stale)."""
        status = event.data.get("status")
        if isinstance(status, str):
            self.saw(status)
        return event.type == "JOB_FINISHED" or status in self.wanted or status in TERMINAL_STATUSES
