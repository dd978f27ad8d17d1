"""Chaos: jobs and automatic reviewers against a real ``hitl up --no-ui`` while faults fire at random.

For ``--seconds`` a fault thread picks, every few seconds, one of: SIGKILL a model replica
(``ray::ServeReplica…`` of Detector, BoxValidator or Segmenter), SIGSTOP one for 2-5 s (a hang:
its heartbeat lapses), SIGKILL the embedded redis-server (``hitl up`` restarts it), SIGSTOP it for
1-3 s, CLIENT KILL every normal Redis connection (the API's and the replicas'). Meanwhile ``--jobs``
jobs are submitted over the whole window, each driven by a reviewer thread that polls
it and answers every new pause: keep all boxes, a third of them plus a manual box (the validator
runs), a quarter sent twice at once (a double click), every one retried with the same
intervention id on a 503 or a dropped connection (docs/protocol.md § Interventions).

The window ends with one more fault (``--last-fault``, default a SIGKILL of redis-server) while
the last jobs are in flight. When the faults stop, the reviewers go on until every job is
terminal or ``--settle-timeout`` runs out. Then: the invariant checker (``loadtest.check_invariants``) and the figures:

- terminal coverage: jobs terminal / jobs not waiting for a person;
- double consumptions: pauses with more than one INTERVENTION_ACCEPTED (and the checker's
  ``pause_consumed_once`` breaches);
- acknowledged interventions lost: a 200 whose pause is not CONSUMED by that intervention id
  (target 0 under ``--durability strict``; measured under ``fast``, where a Redis SIGKILL may
  lose the last second of acknowledged writes);
- duplicated model executions: NODE_STARTED events of one node instance beyond the first (a retry
  is a new instance, so visible retries are counted apart);
- time from the end of the last fault until every job was seen settled.

``--scenario flushall`` (the store comes back empty) and ``--scenario crash-restart`` (the whole
tree SIGKILLed and started again on its data directory and port) fire one fault instead, with
their own figures: see ``benchmarks/chaos_recovery.py``.

    .venv/bin/python benchmarks/chaos.py --jobs 10 --seconds 30
    .venv/bin/python benchmarks/chaos.py --scenario flushall --jobs 20 --seconds 40 --fault-at-s 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

from harness.bench import stop_on_sigterm
from harness.hitl_up import HitlUp
from hitl_review.client.approve_calls import answer_keeping
from hitl_review.serve_app.ops.samples import product_composite
from hitl_review.statecore import keys
from hitl_review.statecore.store import Store
from loadtest.check_invariants import check

TERMINAL = {"SUCCEEDED", "PARTIAL_SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT", "EMPTY_SELECTION"}
WAITING = {"WAITING_USER_SELECTION", "WAITING_BOX_BATCH_REVISION", "WAITING_MASK_REVIEW"}  # a person's turn
MODEL_DEPLOYMENTS = ("Detector", "BoxValidator", "Segmenter")
FAULTS = ("replica_kill", "replica_stop", "redis_kill", "redis_stop", "client_kill")


@dataclass
class Ack:
    job_id: str
    intervention_id: str
    pause_token: str
    body: str


@dataclass
class JobRun:
    index: int
    job_id: str | None = None
    status: str | None = None
    settled_at: float | None = None  # monotonic time the reviewer saw it terminal
    answered: int = 0  # pauses answered
    created_at: float | None = None  # monotonic time of its 202
    codes: Counter[int] = field(default_factory=Counter)


class Run:
    tries = 60  # a request is sent this often (0.5 s apart) on 503s and connection errors

    def __init__(self, up: HitlUp, args: argparse.Namespace) -> None:
        self.up = up
        self.args = args
        self.rng = random.Random(args.seed)
        self.headers = {"Authorization": f"Bearer {up.token}"}
        self.acks: list[Ack] = []
        self.faults: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.last_fault_end = time.monotonic()
        self.stop = threading.Event()
        self.sent = threading.local()  # .at: when this thread last sent a request (a read's lower bound)

    # -------------------------------------------------------------------------------- reviewers

    def _call(self, c: httpx.Client, method: str, url: str, deadline: float, **kw: Any) -> httpx.Response | None:
        """One request, retried on 503/connection errors (bounded by ``deadline`` and ``tries``)."""
        headers = {**self.headers, **kw.pop("headers", {})}
        for _ in range(self.tries):
            if time.monotonic() > deadline:
                return None
            try:
                self.sent.at = time.monotonic()
                r = c.request(method, url, headers=headers, **kw)
                if r.status_code not in (502, 503, 504):
                    return r
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return None

    def creation(self, job: JobRun) -> tuple[str, bytes]:
        """The job's ``Idempotency-Key`` and image: the same on every try of its creation."""
        png, _ = product_composite(seed=1000 + job.index, width=320, height=240)
        return f"chaos-{self.args.seed}-{job.index}", png

    def drive(self, job: JobRun, start_at: float, deadline: float) -> None:
        time.sleep(max(0.0, start_at - time.monotonic()))
        key, png = self.creation(job)
        with httpx.Client(base_url=self.up.api_url, timeout=15) as c:
            r = self._call(
                c,
                "POST",
                "/api/v1/jobs",
                deadline,
                files={"image": (f"{job.index}.png", png, "image/png")},
                headers={"Idempotency-Key": key},
            )
            if r is None or r.status_code != 202:
                job.status = f"NOT_CREATED({r.status_code if r is not None else 'timeout'})"
                return
            job.job_id = str(r.json()["job_id"])
            job.created_at = time.monotonic()
            answered: set[str] = set()
            while time.monotonic() < deadline:
                r = self._call(c, "GET", f"/api/v1/jobs/{job.job_id}", deadline)
                if r is None or r.status_code != 200:
                    time.sleep(1)
                    continue
                snap = r.json()
                job.status = snap["status"]
                self.seen(job, snap)
                if job.status in TERMINAL:
                    job.settled_at = time.monotonic()
                    return
                pause = snap.get("active_pause") or {}
                token = pause.get("pause_token")
                # Round 1 (WAITING_USER_SELECTION) and round 2 (WAITING_BOX_BATCH_REVISION) alike.
                if job.status.startswith("WAITING_") and token and token not in answered:
                    if self.args.think_s > 0:  # a person looks before answering (the pause stays open)
                        time.sleep(random.uniform(0, self.args.think_s))
                    if self._answer(c, job, snap, deadline):
                        answered.add(token)
                time.sleep(self.args.poll_s)

    def _answer(self, c: httpx.Client, job: JobRun, snap: dict[str, Any], deadline: float) -> bool:
        boxes = snap.get("box_list") or []
        pause = snap["active_pause"]
        first_round = pause.get("round", 1) == 1
        subjects = [{"box_id": b["box_id"], "bbox": b["bbox"]} for b in boxes if first_round or b["source"] == "model"]
        if first_round and job.index % 3 == 0:
            subjects.append({"bbox": [20, 20, 120, 120], "label": "manual"})  # the validator scores it
        answer: dict[str, Any] = {"subjects": subjects}
        if pause.get("stage") == "WAITING_MASK_REVIEW":  # a cut-out the gate failed: accepted
            answer = answer_keeping(pause, boxes)
        body = {
            "intervention_id": f"iv_{uuid.uuid4().hex[:12]}",
            "pause_token": pause["pause_token"],
            "base_version": snap["version"],
            **answer,
        }
        url = f"/api/v1/jobs/{job.job_id}/interventions"
        copies = 2 if job.index % 4 == 1 else 1  # a double click: the same intervention twice at once
        results: list[httpx.Response | None] = [None] * copies

        def send(i: int) -> None:
            results[i] = self._call(c, "POST", url, deadline, json=body)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(copies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done = False
        for r in results:
            if r is None:
                continue
            job.codes[r.status_code] += 1
            if r.status_code == 200:
                with self.lock:
                    self.acks.append(Ack(str(job.job_id), body["intervention_id"], body["pause_token"], r.text))
                self.acked(job, snap, body)
                done = True
            elif r.status_code == 409:  # the pause moved on (consumed or superseded): read it again
                done = True
        job.answered += int(done)
        return done

    def seen(self, job: JobRun, snap: dict[str, Any]) -> None:
        """Each 200 of a reviewer's GET (a hook: benchmarks/chaos_recovery.py records the pauses)."""

    def acked(self, job: JobRun, snap: dict[str, Any], body: dict[str, Any]) -> None:
        """Each 200 to an intervention, ``snap`` the GET it answered (a hook, as :meth:`seen`)."""

    # -------------------------------------------------------------------------------------- faults

    def _redis(self) -> list[psutil.Process]:
        assert self.up.child.proc is not None
        root = psutil.Process(self.up.child.proc.pid)
        return [p for p in root.children(recursive=True) if p.name().startswith("redis-server")]

    @staticmethod
    def _replicas() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            line = " ".join(p.info.get("cmdline") or [])
            if "ServeReplica" in line and any(d in line for d in MODEL_DEPLOYMENTS):
                try:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        found.append(p)
                except psutil.Error:
                    pass
        return found

    def fire(self, kind: str) -> dict[str, Any]:
        rec: dict[str, Any] = {"kind": kind, "at_s": round(time.monotonic() - self.t0, 2)}
        if kind == "client_kill":
            assert self.up.redis_url is not None
            try:
                with redis.Redis.from_url(self.up.redis_url, socket_timeout=2) as r:
                    rec["killed"] = int(r.client_kill_filter(_type="normal", skipme=True) or 0)
            except redis.RedisError as e:
                rec["error"] = str(e)
            return rec
        procs = self._replicas() if kind.startswith("replica") else self._redis()
        if not procs:
            rec["error"] = "no process to hit"
            return rec
        p = self.rng.choice(procs)
        rec["pid"] = p.pid
        rec["target"] = next((d for d in MODEL_DEPLOYMENTS if d in " ".join(p.cmdline())), "redis-server")
        try:
            if kind.endswith("_kill"):
                os.kill(p.pid, signal.SIGKILL)
            else:
                held = self.rng.uniform(2, 5) if kind == "replica_stop" else self.rng.uniform(1, 3)
                rec["stopped_s"] = round(held, 1)
                os.kill(p.pid, signal.SIGSTOP)
                self.stop.wait(held)
                os.kill(p.pid, signal.SIGCONT)
        except (ProcessLookupError, psutil.Error) as e:
            rec["error"] = str(e)
        return rec

    def chaos(self, until: float) -> None:
        gap = self.args.fault_gap_s
        while time.monotonic() < until and not self.stop.is_set():
            self.stop.wait(self.rng.uniform(gap / 2, gap * 1.5))
            if time.monotonic() >= until or self.stop.is_set():
                break
            rec = self.fire(self.rng.choice(FAULTS))
            self.last_fault_end = time.monotonic()
            self.faults.append(rec)
            print(f"[chaos] {rec}", flush=True)

    # ----------------------------------------------------------------------------------------- run

    def run(self) -> tuple[list[JobRun], float]:
        self.t0 = time.monotonic()
        fault_end = self.t0 + self.args.seconds
        deadline = fault_end + self.args.settle_timeout
        jobs = [JobRun(i) for i in range(self.args.jobs)]
        spread = self.args.seconds  # the last jobs are in flight when the last fault fires
        drivers = [
            threading.Thread(target=self.drive, args=(j, self.t0 + spread * i / max(1, len(jobs)), deadline))
            for i, j in enumerate(jobs)
        ]
        for t in drivers:
            t.start()
        faults = threading.Thread(target=self.chaos, args=(fault_end,))
        faults.start()
        try:
            faults.join()
            if self.args.last_fault != "none":  # one more, with the last jobs in flight
                rec = self.fire(self.args.last_fault)
                rec["last"] = True
                self.last_fault_end = time.monotonic()
                self.faults.append(rec)
                print(f"[chaos] {rec}", flush=True)
            for t in drivers:
                t.join(max(0.0, deadline - time.monotonic()) + 30)
        finally:
            self.stop.set()
        return jobs, fault_end


async def measure(run: Run, jobs: list[JobRun]) -> dict[str, Any]:
    assert run.up.redis_url is not None
    store = Store.from_url(run.up.redis_url, max_connections=32)
    try:
        rep = await check(store, api_url=run.up.api_url, token=run.up.token, quiet_timeout=30, sse_sample=5)
        statuses: Counter[str] = Counter()
        double = duplicated = retries = 0
        for j in jobs:
            if j.job_id is None:
                statuses[j.status or "NOT_CREATED"] += 1
                continue
            meta = await store.r.hget(keys.job(j.job_id).meta, "status")
            statuses[str(meta)] += 1
            events = await store.events_after(j.job_id)
            accepted = Counter(e.data.get("pause_token") for e in events if e.type == "INTERVENTION_ACCEPTED")
            double += sum(n - 1 for n in accepted.values() if n > 1)
            starts = Counter(e.data.get("node_instance_id") for e in events if e.type == "NODE_STARTED")
            duplicated += sum(n - 1 for n in starts.values() if n > 1)
            retries += sum(e.type == "NODE_RETRY_SCHEDULED" for e in events)
        lost = []
        for a in run.acks:
            raw = await store.r.hget(keys.job(a.job_id).pauses, a.pause_token)
            pause = json.loads(raw) if raw else {}
            by = (pause.get("consumed_by") or {}).get("intervention_id")
            if pause.get("status") != "CONSUMED" or by != a.intervention_id:
                lost.append(asdict(a))
    finally:
        await store.close()
    created = sum(j.job_id is not None for j in jobs)
    terminal = sum(n for s, n in statuses.items() if s in TERMINAL)
    waiting = sum(n for s, n in statuses.items() if s in WAITING)
    return {
        "statuses": dict(statuses),
        "created": created,
        "terminal": terminal,
        "terminal_coverage": round(terminal / max(1, created - waiting), 4),
        "double_consumptions": double,
        "checker_pause_consumed_once_breaches": len(rep.breached().get("pause_consumed_once", [])),
        "acks": len(run.acks),
        "acked_interventions_lost": len(lost),
        "lost": lost[:20],
        "duplicated_model_executions": duplicated,
        "visible_retries": retries,
        "checker_ok": rep.ok,
        "checker": rep.to_json(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--scenario",
        choices=("random", "flushall", "crash-restart"),
        default="random",
        help="random: faults at random (below); flushall: FLUSHALL of the embedded Redis mid-run; "
        "crash-restart: SIGKILL of the whole tree, then hitl up again on the same data directory and port",
    )
    ap.add_argument("--fault-at-s", type=float, default=20, help="flushall, crash-restart: when the one fault fires")
    ap.add_argument("--think-s", type=float, default=0.0, help="a reviewer looks up to this long before answering")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=120, help="how long faults fire")
    ap.add_argument("--fault-gap-s", type=float, default=6.0, help="mean time between two faults")
    ap.add_argument("--settle-timeout", type=float, default=180, help="after the faults, at most this long to settle")
    ap.add_argument("--poll-s", type=float, default=1.0, help="a reviewer reads its job this often")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--durability", choices=("strict", "fast"), default="strict", help="hitl up --durability")
    ap.add_argument("--detector-delay-ms", type=int, default=300, help="hitl up --detector-delay-ms")
    ap.add_argument(
        "--last-fault",
        choices=(*FAULTS, "none"),
        default="redis_kill",
        help="fired when the window ends, with the last jobs in flight",
    )
    ap.add_argument("--data-dir", type=Path, default=None, help="default: a temporary directory")
    ap.add_argument("--json", type=Path, default=Path("benchmarks/out/chaos.json"))
    args = ap.parse_args(argv)
    args.jobs = max(1, min(args.jobs, 500))
    with tempfile.TemporaryDirectory(prefix="hitl-chaos-") as tmp:
        data_dir = args.data_dir or Path(tmp)
        flags = [
            "--heartbeat-s",
            "0.5",
            "--heartbeat-lapse-s",
            "3",
            "--inspector-period-s",
            "1",
            "--detector-delay-ms",
            str(args.detector_delay_ms),
            "--durability",
            args.durability,
            "--max-attempts",
            "5",
        ]
        if args.scenario != "random":
            from benchmarks.chaos_recovery import run_scenario  # it imports this module: here, not at the top

            return run_scenario(args, data_dir, flags)
        up = HitlUp(data_dir, *flags, log_path=data_dir / "chaos-hitl-up.log").start()
        try:
            run = Run(up, args)
            jobs, fault_end = run.run()
            settled = [j.settled_at for j in jobs if j.settled_at is not None]
            all_settled = len(settled) == len(jobs)
            settle_s = max(0.0, max(settled) - run.last_fault_end) if all_settled and settled else None
            figures = asyncio.run(measure(run, jobs))
        finally:
            up.stop(60)
    out = {
        "benchmark": "chaos",
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "hitl_up_flags": flags,
        "faults": run.faults,
        "fault_counts": dict(Counter(f["kind"] for f in run.faults)),
        "all_settled": all_settled,
        "settle_after_last_fault_s": None if settle_s is None else round(settle_s, 2),
        "http_codes": dict(sum((j.codes for j in jobs), Counter())),
        **figures,
    }
    breached = [k for k, v in figures["checker"]["invariants"].items() if v["breaches"]]
    rows = [
        ("jobs created / asked", f"{figures['created']} / {args.jobs}"),
        ("faults fired", ", ".join(f"{k} {n}" for k, n in sorted(out["fault_counts"].items())) or "none"),
        ("statuses", ", ".join(f"{k} {n}" for k, n in sorted(figures["statuses"].items()))),
        ("terminal coverage", f"{figures['terminal_coverage']:.3f}"),
        (
            "double consumptions",
            f"{figures['double_consumptions']} (checker {figures['checker_pause_consumed_once_breaches']})",
        ),
        (
            "acknowledged interventions lost",
            f"{figures['acked_interventions_lost']} of {figures['acks']} 200s (--durability {args.durability})",
        ),
        (
            "duplicated model executions",
            f"{figures['duplicated_model_executions']} (visible retries {figures['visible_retries']})",
        ),
        ("settled after last fault", "not all settled" if settle_s is None else f"{settle_s:.1f} s"),
        (
            "invariant checker",
            "ok" if figures["checker_ok"] else f"BREACH {breached}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    # Under fast a Redis SIGKILL may lose acknowledged writes: measured, not a failure.
    lost_ok = figures["acked_interventions_lost"] == 0 or args.durability == "fast"
    ok = figures["checker_ok"] and lost_ok and figures["double_consumptions"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    stop_on_sigterm()
    raise SystemExit(main())
