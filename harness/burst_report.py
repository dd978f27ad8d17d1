"""The burst benchmark's figures and how they are shown (``benchmarks/burst.py``): the ideal drain
the model deployments allow (``stage_ideal``), the targets each figure is held to (``targets``: the
``targets`` list of the JSON) and the table printed at the end (``print_table``).
"""

from __future__ import annotations

from typing import Any


def stage_ideal(
    jobs: int, approved: int, det_ms: float, seg_ms: float, det: dict[str, Any], seg: dict[str, Any]
) -> dict[str, Any]:
    """The pipelined lower bound on the drain: detection stage ``D = jobs x det_ms / (Detector replicas x
    slots)``, segmentation stage ``G = approved subjects x seg_ms / (Segmenter replicas x slots)`` (one
    node per subject, a job's side by side), ideal ``max(D + one segmentation, one detection + G)`` (the
    stages run on different deployments and overlap).
    ``det_ms`` / ``seg_ms``: the model time of one node, the simulated delay (``hitl up
    --detector-delay-ms`` / ``--segmenter-delay-ms``) or the replicas' measured mean run time.

    Every slot of a replica counts as a node running at once: the model replicas run one thread per
    request slot (``max_ongoing_requests``; ``deployments/serve.py`` gives each replica a thread pool
    that size), so no admitted node waits for a thread. What the bound leaves out is the classical
    models' own compute on the host's cores, kept small by the benchmark's small images."""
    d = jobs * det_ms / 1000 / (det["replicas"] * det["slots"])
    g = approved * seg_ms / 1000 / (seg["replicas"] * seg["slots"])
    ideal = max(d + seg_ms / 1000, det_ms / 1000 + g)
    return {
        "detection_stage_s": round(d, 3),
        "segmentation_stage_s": round(g, 3),
        "ideal_s": round(ideal, 3),
        "serial_ideal_s": round(d + g, 3),
        "formula": (
            f"D = {jobs} jobs x {det_ms:g} ms / ({det['replicas']} Detector replicas x {det['slots']} slots) "
            f"= {d:.2f} s; G = {approved} approved subjects x {seg_ms:g} ms / ({seg['replicas']} Segmenter replicas x "
            f"{seg['slots']} slots) = {g:.2f} s; ideal = max(D + {seg_ms / 1000:g} s, {det_ms / 1000:g} s + G) "
            f"= {ideal:.2f} s (the two stages overlap; D + G = {d + g:.2f} s if they did not)"
        ),
    }


def targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(name: str, value: Any, target: str, met: bool | None) -> None:
        rows.append({"name": name, "value": value, "target": target, "met": met})

    for phase in ("burst", "backlog"):
        b = out.get(phase)
        if not b:
            continue
        p = f"{phase}: "
        add(
            p + "efficiency (ideal / drain)",
            b["efficiency"],
            ">= 0.80",
            None if b["efficiency"] is None else b["efficiency"] >= 0.8,
        )
        bad = b["failed"] + b["timed_out_jobs"] + b["not_terminal"]
        add(p + "FAILED + TIMED_OUT + not terminal", bad, "0", bad == 0)
        add(p + "EXECUTOR_LOST", b["executor_lost"], "0", b["executor_lost"] == 0)
        ok = b["statuses"].get("SUCCEEDED", 0)
        add(
            p + "accepted jobs SUCCEEDED",
            f"{ok}/{b['jobs_accepted']}",
            "all",
            ok == b["jobs_accepted"] == b["jobs_asked"],
        )
        for nt, e in sorted(b["model_executions"].items()):
            per = e["per_node"]
            add(p + f"model executions per node {nt}", per, "1.00", None if per is None else abs(per - 1.0) < 0.005)
        add(p + "dead letters", b["dead_letters"], "0", None if b["dead_letters"] is None else b["dead_letters"] == 0)
    c = out.get("cancel")
    if c:
        share = c["retention_started_share"]
        add(f"cancel: retention started within {c['retention_window_s']:.0f} s", share, "1.00", share == 1.0)
    return rows


def model_time(out: dict[str, Any]) -> str:
    """``500 / 200 ms on 320x240 images``: the simulated model delays and the size of the images."""
    a = out["args"]
    return f"{a['detector_delay_ms']} / {a['segmenter_delay_ms']} ms on {a['image_size']} images"


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    return str(v)


def print_table(out: dict[str, Any]) -> None:
    lines: list[tuple[str, str, str, str]] = []
    tmap = {t["name"]: t for t in out["targets"]}

    def row(name: str, value: Any, key: str | None = None) -> None:
        t = tmap.get(key or "")
        met = "" if t is None else ("-" if t["met"] is None else ("yes" if t["met"] else "NO"))
        lines.append((name, fmt(value), t["target"] if t else "", met))

    for phase in ("burst", "backlog"):
        b = out.get(phase)
        if not b:
            continue
        p = f"{phase}: "
        title = f"{phase} ({b['jobs_accepted']}/{b['jobs_asked']} jobs accepted)"
        if phase == "backlog":
            title += f", hitl up --max-backlog {out['args']['max_backlog']}"
        lines.append((f"== {title}", "", "", ""))
        row("drain: first submit -> last terminal (s)", b["drain_s"] if b["drain_s"] is not None else "timed out")
        row("submissions span (s)", b["submit_span_s"])
        row("model time = simulated delay, detector / segmenter", model_time(out))
        row("ideal (s), see formula below", b["ideal_s"])
        row("efficiency = ideal / drain", b["efficiency"], p + "efficiency (ideal / drain)")
        row("ideal with the replicas' measured run times (s)", b["ideal_s_measured_run_times"])
        st = b["stages_s_after_first_submit"]
        row(
            "last detection / last segmentation done at (s)",
            f"{fmt(st['last_detection_completed'])} / {fmt(st['last_segmentation_completed'])}",
        )
        row(
            "Detector replicas x slots / Segmenter",
            f"{b['detector']['replicas']} x {b['detector']['slots']} / {b['segmenter']['replicas']} x "
            f"{b['segmenter']['slots']}",
        )
        row("jobs by status", ", ".join(f"{k} {v}" for k, v in sorted(b["statuses"].items())))
        row("reason codes", ", ".join(f"{k} {v}" for k, v in sorted(b["reason_codes"].items())) or "none")
        row(
            "FAILED + TIMED_OUT + not terminal",
            f"{b['failed'] + b['timed_out_jobs'] + b['not_terminal']} "
            f"({b['failed']} / {b['timed_out_jobs']} / {b['not_terminal']})",
            p + "FAILED + TIMED_OUT + not terminal",
        )
        row("EXECUTOR_LOST", b["executor_lost"], p + "EXECUTOR_LOST")
        row(
            "accepted jobs SUCCEEDED",
            f"{b['statuses'].get('SUCCEEDED', 0)}/{b['jobs_accepted']}",
            p + "accepted jobs SUCCEEDED",
        )
        for nt, e in sorted(b["model_executions"].items()):
            row(
                f"model executions per node {nt}",
                f"{fmt(e['per_node'])} ({e['executions']} runs / {e['nodes_ran']} nodes, "
                f"mean {fmt(e['mean_run_s'])} s)",
                p + f"model executions per node {nt}",
            )
        ev = b["events"]
        row(
            "NODE_FAILED / NODE_RETRY_SCHEDULED / REPORT_IGNORED",
            f"{ev['NODE_FAILED']} / {ev['NODE_RETRY_SCHEDULED']} / {ev['REPORT_IGNORED']}",
        )
        row("dead letters", b["dead_letters"], p + "dead letters")
        red = b["redis"]
        row(
            "Redis used_memory before / peak (MiB)",
            f"{red['used_memory_before'] / 2**20:.1f} / {red['used_memory_peak_sampled'] / 2**20:.1f} "
            f"(INFO used_memory_peak {red['used_memory_peak_info'] / 2**20:.1f})",
        )
        s = b["submit"]
        row(
            "429 BACKLOG_FULL answers (jobs refused at least once)",
            f"{s['backlog_full_429']} ({s['jobs_refused_at_least_once']})",
        )
        rv = b["reviews"]
        row(
            "intervention p50 / p99 (ms); pause -> accepted p50 (s)",
            f"{fmt(rv['intervention_p50_ms'])} / {fmt(rv['intervention_p99_ms'])}; "
            f"{fmt(rv['pause_to_accepted_p50_s'])}",
        )
    c = out.get("cancel")
    if c:
        lines.append((f"== cancel ({c['waiting_before_cancel']} waiting jobs cancelled at once)", "", "", ""))
        row("cancels answered in (s)", c["cancel_all_s"])
        row("cancel answers", ", ".join(f"{k}: {v}" for k, v in sorted(c["cancel_answers"].items())))
        row(
            f"retention started within {c['retention_window_s']:.0f} s (share)",
            f"{fmt(c['retention_started_share'])} ({c['retention_started']}/{c['waiting_before_cancel']}, "
            f"p50 {fmt(c['retention_started_p50_s'])} s, max {fmt(c['retention_started_max_s'])} s)",
            f"cancel: retention started within {c['retention_window_s']:.0f} s",
        )
    w = [max(len(r[i]) for r in lines) for i in range(4)]
    head = ("metric", "value", "target", "met")
    w = [max(w[i], len(head[i])) for i in range(4)]
    print()
    print(f"{head[0]:<{w[0]}}  {head[1]:<{w[1]}}  {head[2]:<{w[2]}}  {head[3]}")
    print("-" * (sum(w) + 6 + 3))
    for r in lines:
        print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}")
    for phase in ("burst", "backlog"):
        if out.get(phase):
            print(f"\n{phase} ideal: {out[phase]['formula']}")
            if out[phase]["formula_measured_run_times"]:
                print(f"{phase} ideal, measured run times: {out[phase]['formula_measured_run_times']}")
            print(
                f"{phase} replicas: Detector from {out[phase]['detector']['replicas_source']}; "
                f"slots from {out[phase]['detector']['slots_source']}"
            )
    print(
        f"model time: the simulated delay (hitl up --detector-delay-ms / --segmenter-delay-ms), {model_time(out)}; "
        "the classical models' own compute per image comes on top and is not in the ideal (small at this "
        "image size, --image-size)"
    )
    print(
        "model executions per node: the replicas' own ray_hitl_model_node_seconds_count (Ray's Prometheus "
        "endpoint, summed over replicas, increase over the phase, outcomes ok and error: a not_started call "
        "computed nothing) / distinct (job, node type) with a NODE_STARTED"
    )
