"""After a load run: read Redis (read-only, through ``statecore.keys``) and the API, and fail on any
breach of the review protocol's invariants, naming the jobs.

    python -m loadtest.check_invariants --redis-url redis://127.0.0.1:6379/0 \\
        [--api-url http://127.0.0.1:8000 --token T] [--record loadtest/out/record.jsonl] [--json OUT]

It first waits until the system is quiet (no outbox command undelivered or unacked), so jobs that
are merely slow are not judged stuck, then checks every job of the jobs index:

- ``pause_consumed_once``: each pause token opened once, consumed at most once (pause history and
  INTERVENTION_ACCEPTED events agree; clients never saw two fresh 200s for one pause), a consumed
  pause never active again;
- ``consumption_next_step``: a consumed pause wrote exactly one next-node command, of the type its
  INTERVENTION_ACCEPTED names, or ended the job in EMPTY_SELECTION with none;
- ``outbox_accounting``: every other state change that enters model work wrote exactly one command,
  and no command belongs to no state change (commands still in the outbox are matched to writes by
  their shared timestamp: a plan's events and its command carry the same ``now``; a command already
  handled and deleted must have left its trace: the next node to start is the one it announced);
- ``replay_identical``: every 200 a client got for one (job, intervention_id) has the same bytes,
  and they are the bytes of the stored idempotency record;
- ``client_success_committed``: a fresh (not replayed) 200 is an INTERVENTION_ACCEPTED in the log;
- ``create_idempotent``: one Idempotency-Key, one job, byte-identical replays; every accepted job exists;
- ``cancel_final``: nothing but JOB_FINISHED / REPORT_IGNORED after JOB_CANCELLED, same version,
  no later command, the meta still CANCELLED at the cancel's version;
- ``not_stuck``: a live job has an active WAITING pause (and is in the review queue), or a pending
  outbox command for its current node; a queued/running current node without one is a breach once
  the system is quiet (nothing will ever run it), a warning while it is not; a command still pending
  after the grace period (the quiet wait, at least 30 s) is a breach too;
- ``version_monotonic``: event versions never decrease; one atomic write = one version = one
  timestamp, each write one more than the last, starting at 1 (or, for a job restored from the
  archive's live mirror, at its JOB_RESTORED write); REPORT_IGNORED carries the current
  version without bumping it; the meta's version is the last write's;
- ``status_chain``: STATUS_CHANGED events chain ``from``→``to`` along the transition table, end at
  the meta's status, and a terminal job has exactly one JOB_FINISHED;
- ``api_consistent``: ``GET /jobs/{id}`` shows what Redis holds; a finished job's SSE history is its log.

Prints the counts behind each invariant as a table, writes JSON with ``--json``, exits 1 on a breach.

Modules: ``reading`` (Redis, read-only), ``jobs`` (each job against itself), ``records`` (what
clients saw), ``api`` (the API against Redis), ``report`` (the verdict), ``driver`` (a run, the CLI).
"""

from .driver import check, main
from .reading import Command, Job, Write, job_ids, pending_commands, read_job, read_outbox, read_outboxes, wait_quiet
from .report import INVARIANTS, Report, print_report

__all__ = [
    "INVARIANTS",
    "Command",
    "Job",
    "Report",
    "Write",
    "check",
    "job_ids",
    "main",
    "pending_commands",
    "print_report",
    "read_job",
    "read_outbox",
    "read_outboxes",
    "wait_quiet",
]
