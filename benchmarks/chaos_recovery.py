"""Chaos, one fault at a time: the store comes back empty, or the whole ``hitl up`` tree crashes
and starts again (``benchmarks/chaos.py --scenario flushall|crash-restart``).

The jobs and reviewer threads are those of ``benchmarks/chaos.py`` (``--jobs`` jobs spread over
``--seconds``; each reviewer answers every pause, round 1 and round 2, after up to ``--think-s``;
requests retried with the same intervention id on 503s and connection errors, for up to ~3 min
here, since a restart leaves nothing listening on the port for half a minute). At ``--fault-at-s``:

- ``flushall``: as soon as a reviewer next gets a 200 to an intervention (at most 10 s later), so
  that a job has just had its pause consumed while others wait on a reviewer or run model work,
  ``FLUSHALL`` on the embedded Redis, in one MULTI with a read of every job's event list (the
  history before the loss, for the model-execution count). Nobody calls ``hitl admin reconcile``:
  the system is expected to restore what the archive's live mirror holds on its own (read-through
  on a request about the job, a background sweep).
- ``crash-restart``: at the same moment (right after a 200), SIGKILL of the whole tree (Redis, Ray,
  the API), then ``hitl up`` again on the same data directory and ``--api-port``; the reviewers keep
  going against the same URL.

Figures:

- terminal coverage: jobs terminal at the end / jobs created, less those waiting for a person when
  the reviewers stopped (target 1.000);
- acknowledged interventions lost: a 200 whose pause, at the end, is not ``CONSUMED`` by that
  intervention id (read from Redis, or from the archive for a job that finished and left Redis);
- consumed pauses offered again: a pause consumed by a 200 at (stage, round) of a job, after which
  one of that job's reviewer's GETs (each strictly after the 200, in the same thread) showed a
  ``WAITING`` pause at the same stage and round: the person is asked again for something already
  decided (the same token still waiting: the consumption was lost; a new token: a restore from a
  mirror older than the consumption, or a re-offer). Each consumed pause counts at most once.
  Cross-checked from the jobs' events: ``PAUSE_OPENED`` after a ``JOB_RESTORED`` (reason
  ``STORE_RESTORED``) at a consumed pause's stage and round. A restored job's history restarts at
  ``JOB_RESTORED`` (its ids after ``event_base``), so the reviewers' record is the primary count;
- jobs restored (a ``JOB_RESTORED`` event) and restore requeues (``NODE_RETRY_SCHEDULED`` with
  reason ``STORE_RESTORED``: model work started again because the loss took its node);
- duplicated model executions: ``NODE_STARTED`` events of one node instance beyond the first, over
  the history read before the loss and the one after it (a retry or a requeue is a new instance);
- answering again: every job created and not seen terminal by its reviewer at the fault is asked
  for (``GET /jobs/{id}``, one job after the other, rounds 0.25 s apart) from the fault on until it
  answers 200; per job, the time from the fault to that first 200 (the max and p50 in the table;
  the answers before it counted).
  For crash-restart this includes the restart (also given alone: SIGKILL to READY);
- once the run settled, what each client was told, asked again (``benchmarks/chaos_promises.py``):
  acknowledged creations duplicated, interventions answered differently on retry, terminal jobs
  revived and versions gone down (all 0 under strict, issue 35).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.chaos import TERMINAL, WAITING, JobRun, Run
from benchmarks.chaos_promises import Reads, ask_again
from harness.hitl_up import HitlUp
from hitl_review.archive import reads
from hitl_review.archive.db import Archive, archive_url
from hitl_review.statecore import keys
from hitl_review.statecore.store import Store
from loadtest.check_invariants import check


class RecoveryRun(Run):
    tries = 360  # ~3 min: long enough for a restart on the same port

    def __init__(self, up: HitlUp, args: argparse.Namespace, data_dir: Path, flags: list[str]) -> None:
        super().__init__(up, args)
        self.data_dir = data_dir
        self.flags = flags
        self.jobs: list[JobRun] = []
        self.answered_now = threading.Event()
        self.consumed: dict[str, dict[tuple[str, int], dict[str, Any]]] = defaultdict(dict)
        self.reoffered: list[dict[str, Any]] = []
        self.pauses_seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.last_ack: dict[str, float] = {}
        self.pre_events: dict[str, list[dict[str, Any]]] = {}
        self.fault: dict[str, Any] = {}
        self.fault_t: float | None = None
        self.probe: dict[str, dict[str, Any]] = {}
        self.iv_bodies: dict[str, dict[str, Any]] = {}  # intervention id -> the body answered 200
        self.reads = Reads(time.monotonic())
        self.watch_stop = threading.Event()

    def rel(self, t: float | None = None) -> float:
        return round((time.monotonic() if t is None else t) - self.t0, 2)

    # ------------------------------------------------------------------ what the reviewers saw

    def seen(self, job: JobRun, snap: dict[str, Any]) -> None:
        self.reads.record(str(job.job_id), snap, getattr(self.sent, "at", None), "reviewer")
        pause = snap.get("active_pause") or {}
        token = pause.get("pause_token")
        if snap["status"] not in WAITING or not token or pause.get("status", "WAITING") != "WAITING":
            return
        key = (str(pause.get("stage")), int(pause.get("round") or 1))
        jid = str(job.job_id)
        with self.lock:
            if token not in {p["token"] for p in self.pauses_seen[jid]}:
                self.pauses_seen[jid].append({"token": token, "stage": key[0], "round": key[1], "at_s": self.rel()})
            done = self.consumed[jid].get(key)
            if done is not None and not done.get("offered_again"):
                done["offered_again"] = True
                self.reoffered.append(
                    {
                        "job_id": jid,
                        "stage": key[0],
                        "round": key[1],
                        "consumed_token": done["token"],
                        "intervention_id": done["intervention_id"],
                        "acked_at_s": done["at_s"],
                        "offered_token": token,
                        "same_token": token == done["token"],
                        "seen_at_s": self.rel(),
                    }
                )
                print(f"[recovery] offered again: {self.reoffered[-1]}", flush=True)

    def acked(self, job: JobRun, snap: dict[str, Any], body: dict[str, Any]) -> None:
        pause = snap.get("active_pause") or {}
        key = (str(pause.get("stage")), int(pause.get("round") or 1))
        with self.lock:
            self.consumed[str(job.job_id)].setdefault(
                key, {"token": body["pause_token"], "intervention_id": body["intervention_id"], "at_s": self.rel()}
            )
            self.last_ack[str(job.job_id)] = time.monotonic()
            self.iv_bodies.setdefault(body["intervention_id"], body)
        self.answered_now.set()

    # --------------------------------------------------------------------------------- the fault

    def census(self) -> dict[str, Any]:
        """Where the jobs were at the fault, as their reviewers last saw them."""
        now = time.monotonic()
        c: Counter[str] = Counter()
        for j in self.jobs:
            if j.job_id is None:
                c["not created"] += 1
            elif j.status in TERMINAL:
                c["terminal"] += 1
            elif j.status in WAITING:
                c["waiting on a reviewer"] += 1
            else:
                c["model work"] += 1
        recent = sum(now - t < 2 for t in self.last_ack.values())
        return {**c, "answered 200 in the last 2 s": recent}

    def flushall(self) -> None:
        assert self.up.redis_url is not None
        ids = [str(j.job_id) for j in self.jobs if j.job_id is not None]
        with redis.Redis.from_url(self.up.redis_url, socket_timeout=10, decode_responses=True) as r:
            pipe = r.pipeline(transaction=True)
            for jid in ids:
                pipe.lrange(keys.job(jid).events, 0, -1)
            pipe.flushall()
            res = pipe.execute()
        self.fault_t = time.monotonic()
        self.pre_events = {jid: [json.loads(x) for x in raws] for jid, raws in zip(ids, res[:-1], strict=True)}

    def crash_restart(self) -> None:
        old = self.up
        old.kill()
        self.fault_t = time.monotonic()
        self.start_probe()
        try:
            old.wait_port_free(60)
        except RuntimeError as e:
            self.fault["port_error"] = str(e)
        log = self.data_dir / "chaos-hitl-up-restarted.log"
        self.up = HitlUp(self.data_dir, *self.flags, log_path=log, api_port=old.api_port).start(300)
        self.fault["ready_again_s"] = round(time.monotonic() - self.fault_t, 2)
        print(f"[recovery] hitl up READY again {self.fault['ready_again_s']} s after the SIGKILL", flush=True)

    def fire_one(self) -> None:
        self.answered_now.clear()
        self.answered_now.wait(10)  # right after a 200: a pause just consumed
        self.fault = {"kind": self.args.scenario, "census": self.census()}
        if self.args.scenario == "flushall":
            self.flushall()
            self.start_probe()
        else:
            self.crash_restart()
        self.fault["at_s"] = self.rel(self.fault_t)
        print(f"[recovery] {self.fault}", flush=True)

    # ---------------------------------------------------------------------- answering again

    def start_probe(self) -> None:
        live = [j for j in self.jobs if j.job_id is not None and j.status not in TERMINAL]
        self.probe = {
            str(j.job_id): {"first_200_s": None, "codes": Counter(), "created_at_s": self.rel(j.created_at)}
            for j in live
        }
        threading.Thread(target=self._probe, args=(time.monotonic() + self.args.settle_timeout,), daemon=True).start()

    def _probe(self, until: float) -> None:
        assert self.fault_t is not None
        with httpx.Client(base_url=self.up.api_url, headers=self.headers, timeout=5) as c:
            while time.monotonic() < until and not self.stop.is_set():
                pending = [jid for jid, p in self.probe.items() if p["first_200_s"] is None]
                if not pending:
                    return
                for jid in pending:
                    code = self.reads.get(c, jid, "probe")
                    if code == 200:
                        self.probe[jid]["first_200_s"] = round(time.monotonic() - self.fault_t, 2)
                    else:
                        self.probe[jid]["codes"][str(code)] += 1
                time.sleep(0.25)

    def run(self) -> tuple[list[JobRun], float]:
        self.t0 = self.reads.t0 = time.monotonic()
        window_end = self.t0 + self.args.seconds
        deadline = window_end + self.args.settle_timeout
        self.jobs = jobs = [JobRun(i) for i in range(self.args.jobs)]
        drivers = [
            threading.Thread(target=self.drive, args=(j, self.t0 + self.args.seconds * i / len(jobs), deadline))
            for i, j in enumerate(jobs)
        ]
        for t in drivers:
            t.start()
        watch = (self.up.api_url, self.headers, self.watch_stop)
        threading.Thread(target=self.reads.watch, args=watch, daemon=True).start()
        try:
            self.stop.wait(self.args.fault_at_s)
            self.fire_one()
            for t in drivers:
                t.join(max(0.0, deadline - time.monotonic()) + 30)
        finally:
            self.stop.set()
        return jobs, window_end


def _merged_events(pre: list[dict[str, Any]], post: list[Any]) -> list[dict[str, Any]]:
    """The history read before the loss (raw) and the one read at the end (Event models), as dicts,
    each id once (a job that had finished is in both: its archived copy is the whole history)."""
    merged: dict[int, dict[str, Any]] = {}
    for e in pre:  # a raw event's data may be "@meta" (statecore.eventrefs: rebuilt from the meta, lost with it)
        merged[int(e["id"])] = {"type": e["type"], "data": e["data"] if isinstance(e.get("data"), dict) else {}}
    for ev in post:
        merged[int(ev.id)] = {"type": ev.type, "data": ev.data}
    return [merged[i] for i in sorted(merged)]


async def measure(run: RecoveryRun) -> dict[str, Any]:
    assert run.up.redis_url is not None
    store = Store.from_url(run.up.redis_url, max_connections=32)
    archive = Archive(archive_url(run.data_dir))
    statuses: Counter[str] = Counter()
    double = duplicated = restored = requeues = events_offered = 0
    lost: list[dict[str, Any]] = []
    restored_ids: list[str] = []
    try:
        rep = await check(store, api_url=run.up.api_url, token=run.up.token, quiet_timeout=30, sse_sample=5)
        async with httpx.AsyncClient(base_url=run.up.api_url, headers=run.headers, timeout=30) as c:
            for j in run.jobs:
                if j.job_id is None:
                    statuses[j.status or "NOT_CREATED"] += 1
                    continue
                r = await c.get(f"/api/v1/jobs/{j.job_id}")
                statuses[str(r.json().get("status")) if r.status_code == 200 else f"HTTP {r.status_code}"] += 1
                post: list[Any] = await store.events_after(j.job_id)
                if not post:
                    archived = await asyncio.to_thread(reads.events, archive, j.job_id)
                    post = list(archived or [])
                evs = _merged_events(run.pre_events.get(j.job_id, []), post)
                accepted = Counter(e["data"].get("pause_token") for e in evs if e["type"] == "INTERVENTION_ACCEPTED")
                double += sum(n - 1 for n in accepted.values() if n > 1)
                starts = Counter(e["data"].get("node_instance_id") for e in evs if e["type"] == "NODE_STARTED")
                duplicated += sum(n - 1 for n in starts.values() if n > 1)
                if any(e["type"] == "JOB_RESTORED" for e in evs):
                    restored += 1
                    restored_ids.append(j.job_id)
                requeues += sum(
                    e["type"] == "NODE_RETRY_SCHEDULED" and e["data"].get("reason") == "STORE_RESTORED" for e in evs
                )
                fault_s = run.fault.get("at_s") or 0.0  # what was consumed before the loss
                consumed = {k for k, v in run.consumed.get(j.job_id, {}).items() if v["at_s"] < fault_s}
                after_restore = False
                for e in evs:
                    after_restore = after_restore or e["type"] == "JOB_RESTORED"
                    pause = e["data"].get("active_pause") or {}
                    if after_restore and e["type"] == "PAUSE_OPENED":
                        if (str(pause.get("stage")), int(pause.get("round") or 1)) in consumed:
                            events_offered += 1
        for a in run.acks:
            raw = await store.r.hget(keys.job(a.job_id).pauses, a.pause_token)
            if raw:
                pause = json.loads(raw)
            else:  # the job finished and left Redis: the archive's copy
                hist = await asyncio.to_thread(reads.pause_history, archive, a.job_id) or []
                pause = next((p.model_dump() for p in hist if p.pause_token == a.pause_token), {})
            by = (pause.get("consumed_by") or {}).get("intervention_id")
            if pause.get("status") != "CONSUMED" or by != a.intervention_id:
                lost.append({"job_id": a.job_id, "intervention_id": a.intervention_id, "pause": pause})
    finally:
        await store.close()
        archive.close()
    created = sum(j.job_id is not None for j in run.jobs)
    terminal = sum(n for s, n in statuses.items() if s in TERMINAL)
    waiting = sum(n for s, n in statuses.items() if s in WAITING)
    firsts = [p["first_200_s"] for p in run.probe.values()]
    answered = [t for t in firsts if t is not None]
    return {
        "statuses": dict(statuses),
        "created": created,
        "terminal": terminal,
        "terminal_coverage": round(terminal / max(1, created - waiting), 4),
        "acks": len(run.acks),
        "acked_interventions_lost": len(lost),
        "lost": lost[:20],
        "consumed_pauses": sum(len(v) for v in run.consumed.values()),
        "consumed_pauses_offered_again": len(run.reoffered),
        "offered_again": run.reoffered,
        "offered_again_from_events": events_offered,
        "jobs_restored": restored,
        "restored_job_ids": restored_ids,
        "restore_requeues": requeues,
        "duplicated_model_executions": duplicated,
        "double_consumptions": double,
        "live_at_fault": len(firsts),
        "answering_again": len(answered),
        "answer_again_max_s": max(answered) if answered else None,
        "answer_again_p50_s": round(statistics.median(answered), 2) if answered else None,
        "probe": {jid: {**p, "codes": dict(p["codes"])} for jid, p in run.probe.items()},
        "checker_ok": rep.ok,
        "checker": rep.to_json(),
    }


def run_scenario(args: argparse.Namespace, data_dir: Path, flags: list[str]) -> int:
    if args.json == Path("benchmarks/out/chaos.json"):
        args.json = Path(f"benchmarks/out/chaos-{args.scenario}-{args.durability}.json")
    up = HitlUp(data_dir, *flags, log_path=data_dir / "chaos-hitl-up.log").start()
    run = RecoveryRun(up, args, data_dir, flags)
    try:
        run.run()
        promises = ask_again(run)
        f = {**asyncio.run(measure(run)), **promises}
    finally:
        run.up.stop(60)
        if run.up is not up:
            up.kill()  # long dead: its Child's log
    out = {
        "benchmark": f"chaos-{args.scenario}",
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "hitl_up_flags": flags,
        "fault": run.fault,
        "http_codes": dict(sum((j.codes for j in run.jobs), Counter())),
        "pauses_seen": run.pauses_seen,
        **f,
    }
    codes = sum((Counter(p["codes"]) for p in f["probe"].values()), Counter())
    census = ", ".join(f"{k} {n}" for k, n in run.fault.get("census", {}).items())
    what = "FLUSHALL" if args.scenario == "flushall" else f"SIGKILL, READY again {run.fault.get('ready_again_s')} s"
    # The checker reads the histories Redis holds: a restored job's history starts at JOB_RESTORED.
    on_restored = {
        k: all(jid in f["restored_job_ids"] for jid in v.get("jobs", {}))
        for k, v in f["checker"]["invariants"].items()
        if v["breaches"]
    }
    breached = [f"{k} (restored jobs only)" if only else k for k, only in on_restored.items()]
    rows = [
        ("scenario", f"{args.scenario} --durability {args.durability}"),
        ("fault", f"{what} at {run.fault.get('at_s')} s; jobs then: {census}"),
        ("jobs created / asked", f"{f['created']} / {args.jobs}"),
        ("statuses", ", ".join(f"{k} {n}" for k, n in sorted(f["statuses"].items()))),
        ("terminal coverage", f"{f['terminal_coverage']:.3f}"),
        ("acknowledged interventions lost", f"{f['acked_interventions_lost']} of {f['acks']} 200s"),
        (
            "consumed pauses offered again",
            f"{f['consumed_pauses_offered_again']} of {f['consumed_pauses']}"
            f" (events: {f['offered_again_from_events']})",
        ),
        ("jobs restored / restore requeues", f"{f['jobs_restored']} / {f['restore_requeues']}"),
        ("duplicated model executions", str(f["duplicated_model_executions"])),
        ("double consumptions", str(f["double_consumptions"])),
        (
            "acknowledged creations duplicated",
            f"{f['acked_creations_duplicated']} of {f['creations_retried']} retried"
            f" (refused: {f['creation_retries_refused']})",
        ),
        (
            "interventions answered differently on retry",
            f"{f['interventions_answered_differently']} of {f['interventions_retried']}",
        ),
        (
            "terminal jobs revived / versions gone down",
            f"{f['terminal_jobs_revived']} / {f['versions_gone_down']} (over {f['reads']} reads)",
        ),
        (
            "live jobs answering again",
            f"{f['answering_again']} of {f['live_at_fault']}: max {f['answer_again_max_s']} s, "
            f"p50 {f['answer_again_p50_s']} s (before: {dict(codes) or 'none'})",
        ),
        ("invariant checker", "ok" if f["checker_ok"] else f"BREACH {breached}"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {args.json}")
    ok = f["terminal_coverage"] == 1 and f["answering_again"] == f["live_at_fault"] and f["double_consumptions"] == 0
    if args.durability == "strict":  # under fast, what the loss took is measured, not a failure
        ok = ok and f["acked_interventions_lost"] == 0 and f["consumed_pauses_offered_again"] == 0
        broken = ("acked_creations_duplicated", "creation_retries_refused", "interventions_answered_differently")
        ok = ok and not any(f[k] for k in (*broken, "terminal_jobs_revived", "versions_gone_down"))
    return 0 if ok else 1
