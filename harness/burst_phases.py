"""The burst benchmark's phases (``benchmarks/burst.py``) and every figure each one reports.

- ``burst_phase``: N jobs at once, reviewed automatically, to a terminal state; then the drain
  against the ideal (``harness.burst_report.stage_ideal``) with the replicas and slots Serve ran
  (``capacity``), the jobs by status and reason, the model executions per node (the replicas' own
  counts of ``ok`` and ``error`` runs, not the ``not_started`` calls), the events, dead letters,
  Redis memory, the 429s and the reviews. The admission-control phase is the same on a ``hitl up``
  with ``--max-backlog``;
- ``cancel_phase``: N jobs to waiting, all cancelled at once, then how soon each one's retention started.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from harness.bench import log, parse_at, pct
from harness.burst_report import stage_ideal
from harness.burst_stack import TERMINAL, WAITING, Stack, Tally, drive, error_code, sample_memory
from harness.serve_status import executed
from hitl_review.deployments.serve import DEFAULT_AUTOSCALING, DEFAULT_BATCH
from hitl_review.statecore.nodes import MODEL_NODES

DETECT = "DETECT_SUBJECTS"
SEGMENT = ("PROCESS_APPROVED_BOX_LIST", "SEGMENT_SUBJECT")
# What deployments/serve.py gives a deployment when the --config file says nothing.
DEFAULT_MAX_REPLICAS = int(DEFAULT_AUTOSCALING["max_replicas"])
DEFAULT_SLOTS = max(8, 2 * int(DEFAULT_BATCH["max_batch_size"]))
RETENTION_WINDOW_S = 120.0


def stage_of(node_type: str) -> str:
    return "detect" if node_type == DETECT else "segment" if node_type in SEGMENT else "other"


def capacity(stack: Stack, name: str, counts: dict[str, Any] | None) -> dict[str, Any]:
    """Replicas and slots of a deployment as Serve ran it in this phase, and where the figure came from."""
    w = stack.watcher
    replicas, source = 0, ""
    if w is not None and w.max_running.get(name):
        replicas, source = w.max_running[name], "Serve status API: most replicas RUNNING during the phase"
    elif counts and counts["replicas"].get(name):
        replicas, source = counts["replicas"][name], "replicas seen in Ray's metrics"
    else:
        replicas, source = DEFAULT_MAX_REPLICAS, "deployments/serve.py default max_replicas"
    slots = w.slots(name) if w is not None else None
    slot_source = "Serve status API: max_ongoing_requests"
    if not slots:
        slots, slot_source = DEFAULT_SLOTS, "deployments/serve.py default max_ongoing_requests"
    return {
        "replicas": replicas,
        "replicas_source": source,
        "max_replicas_configured": w.max_replicas_configured(name) if w is not None else None,
        "autoscaler_target_max": w.max_target.get(name) if w is not None else None,
        "slots": slots,
        "slots_source": slot_source,
    }


async def burst_phase(stack: Stack, n: int, label: str) -> dict[str, Any]:
    """``n`` jobs at once, reviewed automatically, to a terminal state; then every figure of the phase."""
    args = stack.args
    if stack.watcher is not None:
        stack.watcher.reset_peaks()
    base_counts = await asyncio.to_thread(stack.node_counts)
    mem0 = await stack.used_memory()
    samples: list[int] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_memory(stack, samples, stop))
    tally = Tally()
    try:
        res = await drive(stack, n, label, review=True, until=TERMINAL, tally=tally)
    finally:
        stop.set()
        await sampler
    mem1 = await stack.used_memory()
    job_ids = list(tally.accepted)
    log(f"{label}: reading {len(job_ids)} jobs' events")
    events = await stack.history(job_ids)

    finished_at: list[float] = []
    by_status: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    ev_counts: Counter[str] = Counter()
    nodes: dict[str, set[tuple[str, str]]] = {}
    attempts: Counter[str] = Counter()
    review_lag: list[float] = []
    stage_times: dict[tuple[str, str], list[float]] = {}
    for j in job_ids:
        evs = events.get(j, [])
        st = res["status"].get(j, "UNKNOWN")
        by_status[st] += 1
        opened: float | None = None
        for e in evs:
            t = e["type"]
            ev_counts[t] += 1
            data = e.get("data") or {}
            if t == "NODE_STARTED":
                nt = str(data.get("node_type"))
                nodes.setdefault(nt, set()).add((j, str(data.get("box_id") or data.get("subject_id") or "")))
                attempts[nt] += 1
                stage_times.setdefault(("started", stage_of(nt)), []).append(parse_at(e["at"]))
            elif t == "NODE_COMPLETED":
                stage_times.setdefault(("completed", stage_of(str(data.get("node_type")))), []).append(
                    parse_at(e["at"])
                )
            elif t == "PAUSE_OPENED":
                opened = parse_at(e["at"])
            elif t == "INTERVENTION_ACCEPTED" and opened is not None:
                review_lag.append(parse_at(e["at"]) - opened)
                opened = None
            elif t == "JOB_FINISHED":
                finished_at.append(parse_at(e["at"]))
                if data.get("reason_code"):
                    by_reason[str(data["reason_code"])] += 1
    # Only the node types a model deployment runs (FINALIZE_RESULTS runs in the control plane).
    model_types = {str(t.value) for t in MODEL_NODES} | set(SEGMENT)
    node_starts = sum(n for nt, n in attempts.items() if nt in model_types)
    log(f"{label}: waiting for the replicas' metrics to count {node_starts} node starts")
    base_total = sum(executed((base_counts or {}).get("count", {})).values())
    counts = await asyncio.to_thread(stack.node_counts, int(base_total + node_starts))
    dead = await stack.dead_letters()
    phase_ids = set(job_ids)

    executions: dict[str, Any] = {}
    if counts is not None:
        delta = {k: v - (base_counts or {}).get("count", {}).get(k, 0.0) for k, v in counts["count"].items()}
        dsum = {k: v - (base_counts or {}).get("sum", {}).get(k, 0.0) for k, v in counts["sum"].items()}
        # Executions are the ok and error runs: a not_started call (its node was already running
        # elsewhere, or superseded) computed nothing, and is counted apart.
        ran_delta, ran_dsum = executed(delta), executed(dsum)
        for nt in sorted({k[1] for k in delta} | (set(nodes) & model_types)):
            ran = len(nodes.get(nt, ()))
            execs = sum(v for k, v in ran_delta.items() if k[1] == nt)
            ok = sum(v for k, v in ran_delta.items() if k[1] == nt and k[2] == "ok")
            skipped = sum(v for k, v in delta.items() if k[1] == nt and k not in ran_delta)
            secs = sum(v for k, v in ran_dsum.items() if k[1] == nt)
            executions[nt] = {
                "executions": int(round(execs)),
                "executions_ok": int(round(ok)),
                "calls_not_started": int(round(skipped)),
                "nodes_ran": ran,
                "attempts_started": attempts.get(nt, 0),
                "per_node": round(execs / ran, 3) if ran else None,
                "mean_run_s": round(secs / execs, 3) if execs else None,
            }
    n_jobs = len(job_ids)
    # Each approved subject is one segmentation (its own SEGMENT_SUBJECT node, side by side with its
    # job's others); a job of an earlier build's PROCESS_APPROVED_BOX_LIST is one for all its subjects.
    approved = len(nodes.get("SEGMENT_SUBJECT", ())) + len(nodes.get("PROCESS_APPROVED_BOX_LIST", ()))
    det = capacity(stack, "Detector", counts)
    seg = capacity(stack, "Segmenter", counts)
    # Model time: the simulated delay of hitl up (--detector-delay-ms, --segmenter-delay-ms).
    ideal = stage_ideal(n_jobs, approved, args.detector_delay_ms, args.segmenter_delay_ms, det, seg)
    # The same bound with the time a run really took in the replicas (delay + the classical model's own
    # work + contention for the cores), so a low efficiency can be told apart from slow models.
    mean_det = (executions.get(DETECT) or {}).get("mean_run_s")
    mean_seg = next((executions[t]["mean_run_s"] for t in SEGMENT if (executions.get(t) or {}).get("mean_run_s")), None)
    measured = (
        stage_ideal(n_jobs, approved, mean_det * 1000, mean_seg * 1000, det, seg)
        if mean_det is not None and mean_seg is not None
        else None
    )
    first = tally.first_submit

    def span(kind: str, stage: str, end: bool = True) -> float | None:
        ts = stage_times.get((kind, stage))
        return round((max(ts) if end else min(ts)) - first, 3) if ts and first else None

    drain = (max(finished_at) - tally.first_submit) if finished_at and tally.first_submit else None
    polled = (res["done_at"] - tally.first_submit) if res["done_at"] and tally.first_submit else None
    not_terminal = sum(1 for j in job_ids if res["status"].get(j) not in TERMINAL)
    return {
        "jobs_asked": n,
        "jobs_accepted": n_jobs,
        "not_created": dict(tally.not_created),
        "timed_out": res["timed_out"],
        "submit_span_s": round(tally.last_accept - tally.first_submit, 3)
        if tally.last_accept and tally.first_submit
        else None,
        "drain_s": round(drain, 3) if drain is not None and not res["timed_out"] else None,
        "drain_s_partial": round(drain, 3) if drain is not None else None,
        "drain_s_polled": round(polled, 3) if polled is not None else None,
        **ideal,
        "ideal_s_measured_run_times": None if measured is None else measured["ideal_s"],
        "formula_measured_run_times": None if measured is None else measured["formula"],
        "stages_s_after_first_submit": {
            "first_detection_started": span("started", "detect", end=False),
            "last_detection_completed": span("completed", "detect"),
            "first_segmentation_started": span("started", "segment", end=False),
            "last_segmentation_completed": span("completed", "segment"),
        },
        "efficiency": round(ideal["ideal_s"] / drain, 3) if drain and not res["timed_out"] else None,
        "detector": det,
        "segmenter": seg,
        "statuses": dict(by_status),
        "not_terminal": not_terminal,
        "reason_codes": dict(by_reason),
        "failed": by_status.get("FAILED", 0),
        "timed_out_jobs": by_status.get("TIMED_OUT", 0),
        "executor_lost": by_reason.get("EXECUTOR_LOST", 0),
        "events": {
            k: ev_counts.get(k, 0)
            for k in ("NODE_STARTED", "NODE_COMPLETED", "NODE_FAILED", "NODE_RETRY_SCHEDULED", "NODE_TIMED_OUT")
            + ("REPORT_IGNORED", "PAUSE_OPENED", "INTERVENTION_ACCEPTED", "JOB_FINISHED")
        },
        "model_executions": executions,
        "metrics_settled": None if counts is None else counts["settled"],
        "metrics_url": stack.metrics_url,
        "replicas_in_metrics": None if counts is None else counts["replicas"],
        "dead_letters": None if dead is None else sum(1 for d in dead if d.get("job_id") in phase_ids),
        "dead_letters_total": None if dead is None else len(dead),
        "dead_letter_reasons": None if dead is None else dict(Counter(str(d.get("reason")) for d in dead)),
        "redis": {
            "used_memory_before": mem0["used_memory"],
            "used_memory_peak_sampled": max(samples, default=mem1["used_memory"]),
            "used_memory_after": mem1["used_memory"],
            "used_memory_peak_info": mem1["used_memory_peak"],
            "samples": len(samples),
        },
        "submit": {
            "codes": dict(tally.submit_codes),
            "backlog_full_429": tally.backlog_full,
            "jobs_refused_at_least_once": tally.jobs_refused_once,
            "retry_after_s_max": max(tally.retry_after_s, default=None),
            "transport_retries": tally.transport_retries,
        },
        "reviews": {
            "interventions": dict(tally.interventions),
            "kept_nothing": tally.kept_nothing,
            "intervention_p50_ms": round(pct(tally.intervention_s, 0.5) * 1000, 1) if tally.intervention_s else None,
            "intervention_p99_ms": round(pct(tally.intervention_s, 0.99) * 1000, 1) if tally.intervention_s else None,
            "pause_to_accepted_p50_s": round(pct(review_lag, 0.5), 3) if review_lag else None,
            "pause_to_accepted_p95_s": round(pct(review_lag, 0.95), 3) if review_lag else None,
        },
    }


async def cancel_phase(stack: Stack, n: int) -> dict[str, Any]:
    """``n`` jobs to waiting, all cancelled at once, then how soon each one's retention started."""
    args = stack.args
    tally = Tally()
    res = await drive(stack, n, "cancel", review=False, until=(*TERMINAL, *WAITING), tally=tally)
    job_ids = list(tally.accepted)
    waiting = [j for j in job_ids if res["status"].get(j) in WAITING]
    log(f"cancel: {len(waiting)} of {len(job_ids)} jobs waiting for review; cancelling them all at once")
    sem = asyncio.Semaphore(args.submit_concurrency)
    deadline = time.monotonic() + args.timeout_s
    codes: Counter[str] = Counter()

    async def cancel(j: str) -> None:
        async with sem:
            r = await stack.call(tally, "POST", f"/api/v1/jobs/{j}/cancel", deadline)
            codes["timeout" if r is None else f"{r.status_code} {error_code(r)}".strip()] += 1

    t0 = time.monotonic()
    await asyncio.gather(*(cancel(j) for j in waiting))
    cancel_s = time.monotonic() - t0
    log(f"cancel: {len(waiting)} cancels answered in {cancel_s:.1f}s: {dict(codes)}")
    started: dict[str, float] = {}
    pending = list(waiting)
    last_print = 0.0
    while pending and time.monotonic() - t0 < RETENTION_WINDOW_S:
        ttl = await stack.ttls(pending)
        now = time.monotonic() - t0
        for j, t in ttl.items():
            if t > 0 or t == -2:  # a TTL is set (or the records already expired: retention ran)
                started[j] = now
        pending = [j for j in pending if j not in started]
        if time.monotonic() - last_print >= args.progress_s or not pending:
            last_print = time.monotonic()
            log(f"cancel: {now:6.1f}s after the cancels: retention started for {len(started)}/{len(waiting)}")
        if pending:
            await asyncio.sleep(1.0)
    after = await stack.statuses(waiting)
    times = list(started.values())
    return {
        "jobs_asked": n,
        "jobs_accepted": len(job_ids),
        "waiting_before_cancel": len(waiting),
        "not_waiting": dict(Counter(res["status"].get(j, "UNKNOWN") for j in job_ids if j not in set(waiting))),
        "cancel_answers": dict(codes),
        "cancel_all_s": round(cancel_s, 3),
        "statuses_after": dict(Counter(after.values())),
        "retention_started": len(started),
        "retention_started_share": round(len(started) / len(waiting), 4) if waiting else None,
        "retention_window_s": RETENTION_WINDOW_S,
        "retention_started_p50_s": round(pct(times, 0.5), 2) if times else None,
        "retention_started_max_s": round(max(times), 2) if times else None,
    }
