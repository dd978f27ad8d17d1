"""The verdict: per invariant, how many things were checked and which jobs breached it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..common import format_table

INVARIANTS: dict[str, str] = {
    "pause_consumed_once": "each pause opened once and consumed at most once",
    "consumption_next_step": "a consumed pause has exactly one next-node command or EMPTY_SELECTION",
    "outbox_accounting": "every command belongs to exactly one state change that enters model work",
    "replay_identical": "all 200s for one (job, intervention_id) are byte-identical to the stored one",
    "client_success_committed": "a fresh 200 is an INTERVENTION_ACCEPTED in the job's log",
    "create_idempotent": "one Idempotency-Key, one job, identical replays; accepted jobs exist",
    "cancel_final": "a cancelled job never moved afterwards",
    "not_stuck": "a live job has an active pause, a pending command or a running node",
    "version_monotonic": "versions never decrease; one version per atomic write, +1 each",
    "status_chain": "status changes chain along the transition table to the meta's status",
    "api_consistent": "the API shows what Redis holds",
}
MAX_DETAILS = 5


@dataclass
class Tally:
    checked: int = 0
    breaches: dict[str, list[str]] = field(default_factory=dict)  # job id -> details
    warnings: dict[str, list[str]] = field(default_factory=dict)


class Report:
    def __init__(self) -> None:
        self.inv = {name: Tally() for name in INVARIANTS}
        self.info: dict[str, Any] = {}

    def checked(self, name: str, n: int = 1) -> None:
        self.inv[name].checked += n

    def breach(self, name: str, job_id: str, detail: str) -> None:
        details = self.inv[name].breaches.setdefault(job_id, [])
        if len(details) < MAX_DETAILS:
            details.append(detail)

    def warn(self, name: str, job_id: str, detail: str) -> None:
        details = self.inv[name].warnings.setdefault(job_id, [])
        if len(details) < MAX_DETAILS:
            details.append(detail)

    @property
    def breach_count(self) -> int:
        return sum(len(t.breaches) for t in self.inv.values())

    @property
    def ok(self) -> bool:
        return self.breach_count == 0

    def breached(self) -> dict[str, list[str]]:
        """Invariant -> offending job ids (only the breached invariants)."""
        return {k: sorted(t.breaches) for k, t in self.inv.items() if t.breaches}

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "breaches": self.breach_count,
            **self.info,
            "invariants": {
                k: {
                    "description": INVARIANTS[k],
                    "checked": t.checked,
                    "breaches": len(t.breaches),
                    "warnings": len(t.warnings),
                    "jobs": t.breaches,
                    "warned_jobs": t.warnings,
                }
                for k, t in self.inv.items()
            },
        }

    def table(self, max_ids: int = 4) -> str:
        rows = []
        for k, t in self.inv.items():
            ids = sorted(t.breaches)
            shown = ", ".join(ids[:max_ids]) + (f" (+{len(ids) - max_ids})" if len(ids) > max_ids else "")
            rows.append([k, t.checked, len(t.breaches), len(t.warnings), shown])
        return format_table(["invariant", "checked", "breaches", "warnings", "offending jobs"], rows)

    def details(self) -> str:
        out = []
        for k, t in self.inv.items():
            for job_id, ds in sorted(t.breaches.items()):
                for d in ds:
                    out.append(f"BREACH {k} job={job_id}: {d}")
            for job_id, ds in sorted(t.warnings.items())[:10]:
                for d in ds[:1]:
                    out.append(f"warning {k} job={job_id}: {d}")
        return "\n".join(out)


def print_report(rep: Report) -> None:
    i = rep.info
    print(
        f"invariant check: {i.get('jobs', 0)} jobs, {i.get('commands', 0)} outbox commands, "
        f"{i.get('records', 0)} client records; quiet={i.get('quiet')} after {i.get('waited_s')}s "
        f"(pending {i.get('pending_after_wait')})"
    )
    print("statuses: " + ", ".join(f"{k}={v}" for k, v in (i.get("statuses") or {}).items()))
    print(rep.table())
    details = rep.details()
    if details:
        print(details)
    if rep.ok:
        print("invariants: OK (0 breaches)")
    else:
        print(f"invariants: {rep.breach_count} BREACHES")
        for inv, ids in rep.breached().items():
            print(f"  {inv}: {' '.join(ids)}")
