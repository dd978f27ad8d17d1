"""Locust scenarios for the review protocol under load (docs/protocol.md § Intervention).

Six user classes play the people and accidents the pause protocol must survive:

- ``Submitter``      creates jobs (small product composites) with ``Idempotency-Key``s; some keys are
                     deliberately repeated (same job id, byte-identical body, ``Idempotent-Replayed``),
                     a few reused with another image (409 ``IDEMPOTENCY_CONFLICT``).
- ``Reviewer``       follows a job's SSE stream; at every ``PAUSE_OPENED`` submits a plausible subset
                     (keeps some boxes, deletes some, draws a manual box now and then, fixes or drops
                     the boxes a round-2 pause asks to revise) until ``JOB_FINISHED``.
- ``DoubleClicker``  sends one intervention twice a few milliseconds apart (two concurrent requests).
- ``RivalReviewers`` two or more reviewers (separate sessions) race on one pause with different ids.
- ``StaleTab``       submits with an old ``base_version`` or an old ``pause_token``, then redraws from
                     the 409's snapshot and submits again.
- ``Canceller``      cancels jobs while they detect, wait or segment, then checks nothing moves them.

Configuration (command line or environment; ``locust -f loadtest/locustfile.py --help``):
``--hitl-weights``/``HITL_LT_WEIGHTS`` ("Reviewer=4,Canceller=1"), ``--hitl-counts``/``HITL_LT_COUNTS``
(fixed user counts), ``--hitl-record``/``HITL_LT_RECORD`` (JSONL of every intervention and creation
answer, for ``loadtest.check_invariants``), ``--hitl-summary``/``HITL_LT_SUMMARY`` (status counts,
written at the end), token from ``HITL_TOKEN`` or ``<HITL_DATA_DIR>/api-token``. Classes can also be
chosen by name on the command line (``locust ... Reviewer StaleTab``) and by ``--tags``.

Every request is named ``<route> <outcome>`` ("interventions 200", "interventions replay",
"interventions 409 VERSION_CONFLICT", "jobs 202", "cancel 409 JOB_TERMINAL"), so locust's table shows
each answer separately, and carries an ``X-Request-ID``. Protocol checks that span several requests
(one winner per race, a stale tab never wins) are reported as request type ``CHECK``; time from
opening a stream to an event as type ``SSE``.
"""

from __future__ import annotations

from loadtest.scenarios import users
from loadtest.scenarios.hooks import listen_to_locust_events

# Locust spawns the User classes it finds in this module's namespace, in the order they appear here
# (the order they were written in, as the docstring lists them).
Submitter = users.Submitter
Reviewer = users.Reviewer
DoubleClicker = users.DoubleClicker
RivalReviewers = users.RivalReviewers
StaleTab = users.StaleTab
Canceller = users.Canceller

listen_to_locust_events()
