"""What a client was told, asked again after a store loss (issue 35; ``benchmarks/chaos_recovery.py``).

Black-box through the API, once the run settled (the reviewers stopped):

- acknowledged creations duplicated: every job's creation sent again with its ``Idempotency-Key``
  and image; an answer naming another job, or a 202 without ``Idempotent-Replayed: true`` (a new
  creation), counts. Any other answer (a 409, no answer) is listed apart as refused;
- interventions answered differently on retry: every intervention answered 200 sent again, the
  same body, the same reviewer; an answer whose status or body text differs from the first 200
  counts (the replay is the first answer, byte for byte);
- terminal jobs revived, versions gone down: every 200 to a ``GET /jobs/{id}`` (the reviewers',
  the probe's, a watcher's that reads every job a client saw terminal every ``WATCH_S``, and one
  read of each job at the end) is kept with the moment its request was sent and its answer came.
  A read sent after another read's answer came back must not show the job live when that one
  showed it terminal, nor a lower version (concurrent reads are not compared). Each job counts at
  most once per figure; the first case is kept.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import httpx

from benchmarks.chaos import TERMINAL

if TYPE_CHECKING:
    from benchmarks.chaos_recovery import RecoveryRun

WATCH_S = 2.0


@dataclass
class Read:
    sent: float
    came: float
    status: str
    version: int
    source: str


class Reads:
    """Every job read a client got, for the two monotonic figures."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.lock = threading.Lock()
        self.by_job: dict[str, list[Read]] = defaultdict(list)
        self.terminal: set[str] = set()

    def record(self, job_id: str, snap: dict[str, Any], sent: float | None, source: str) -> None:
        came = time.monotonic()
        status = str(snap.get("status"))
        with self.lock:
            self.by_job[job_id].append(Read(came if sent is None else sent, came, status, int(snap["version"]), source))
            if status in TERMINAL:
                self.terminal.add(job_id)

    def watch(self, base_url: str, headers: dict[str, str], stop: threading.Event) -> None:
        """Reads again, every ``WATCH_S``, each job some client saw terminal (a reviewer stops there)."""
        with httpx.Client(base_url=base_url, headers=headers, timeout=10) as c:
            while not stop.wait(WATCH_S):
                with self.lock:
                    ids = sorted(self.terminal)
                for jid in ids:
                    self.get(c, jid, "watch")

    def get(self, c: httpx.Client, job_id: str, source: str) -> int | str:
        sent = time.monotonic()
        try:
            r = c.get(f"/api/v1/jobs/{job_id}")
        except httpx.HTTPError as e:
            return type(e).__name__
        if r.status_code == 200:
            self.record(job_id, r.json(), sent, source)
        return r.status_code

    def _at(self, r: Read) -> dict[str, Any]:
        return {**asdict(r), "sent": round(r.sent - self.t0, 2), "came": round(r.came - self.t0, 2)}

    def figures(self) -> dict[str, Any]:
        revived: list[dict[str, Any]] = []
        down: list[dict[str, Any]] = []
        for jid, reads in sorted(self.by_job.items()):
            by_came = sorted(reads, key=lambda r: r.came)
            found_revived = found_down = False
            for b in sorted(reads, key=lambda r: r.sent):
                before = [a for a in by_came if a.came < b.sent]
                if not before:
                    continue
                ended = next((a for a in reversed(before) if a.status in TERMINAL), None)
                if ended is not None and b.status not in TERMINAL and not found_revived:
                    found_revived = True
                    revived.append({"job_id": jid, "seen": self._at(ended), "then": self._at(b)})
                top = max(before, key=lambda a: a.version)
                if b.version < top.version and not found_down:
                    found_down = True
                    down.append({"job_id": jid, "seen": self._at(top), "then": self._at(b)})
        return {
            "reads": sum(len(v) for v in self.by_job.values()),
            "reads_by_source": dict(Counter(r.source for v in self.by_job.values() for r in v)),
            "terminal_jobs_revived": len(revived),
            "revived": revived,
            "versions_gone_down": len(down),
            "went_down": down,
        }


def replay_creations(run: RecoveryRun, c: httpx.Client, deadline: float) -> dict[str, Any]:
    dup: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    replayed = 0
    for job in run.jobs:
        if job.job_id is None:  # never acknowledged
            continue
        key, png = run.creation(job)
        files = {"image": (f"{job.index}.png", png, "image/png")}
        r = run._call(c, "POST", "/api/v1/jobs", deadline, files=files, headers={"Idempotency-Key": key})
        if r is None or r.status_code != 202:
            got = {"code": None, "body": None} if r is None else {"code": r.status_code, "body": r.text}
            refused.append({"job_id": job.job_id, **got})
            continue
        again, flag = str(r.json().get("job_id")), r.headers.get("Idempotent-Replayed")
        if again != job.job_id or flag != "true":
            dup.append({"job_id": job.job_id, "answered_job_id": again, "replayed_header": flag})
        else:
            replayed += 1
    return {
        "creations_retried": replayed + len(dup) + len(refused),
        "creations_replayed": replayed,
        "acked_creations_duplicated": len(dup),
        "duplicated": dup,
        "creation_retries_refused": len(refused),
        "refused": refused,
    }


def replay_interventions(run: RecoveryRun, c: httpx.Client, deadline: float) -> dict[str, Any]:
    first: dict[str, tuple[str, str]] = {}  # intervention id -> (job id, its first 200's body)
    twins_differ = 0  # a double click's two 200s with different bodies
    for a in run.acks:
        if a.intervention_id in first:
            twins_differ += first[a.intervention_id][1] != a.body
        else:
            first[a.intervention_id] = (a.job_id, a.body)
    differ: list[dict[str, Any]] = []
    for iid, (jid, text) in first.items():
        body = run.iv_bodies[iid]
        r = run._call(c, "POST", f"/api/v1/jobs/{jid}/interventions", deadline, json=body)
        if r is None or r.status_code != 200 or r.text != text:
            differ.append(
                {
                    "job_id": jid,
                    "intervention_id": iid,
                    "first": text,
                    "code": None if r is None else r.status_code,
                    "again": None if r is None else r.text,
                    "replayed_header": None if r is None else r.headers.get("Idempotent-Replayed"),
                }
            )
    return {
        "interventions_retried": len(first),
        "interventions_answered_differently": len(differ),
        "answered_differently": differ,
        "double_click_200s_differing": twins_differ,
    }


def ask_again(run: RecoveryRun) -> dict[str, Any]:
    """After the run: the retries, then one read of every job; the watcher stops after them."""
    deadline = time.monotonic() + 180
    with httpx.Client(base_url=run.up.api_url, timeout=30) as c:
        out = {**replay_creations(run, c, deadline), **replay_interventions(run, c, deadline)}
        c.headers.update(run.headers)
        for job in run.jobs:
            if job.job_id is not None:
                run.reads.get(c, job.job_id, "final")
    run.watch_stop.set()
    return {**out, **run.reads.figures()}
