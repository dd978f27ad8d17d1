"""The figures of a ``benchmarks/reviewer.py`` scenario (``figures``: latencies from the pages' timestamps,
refusals from the jobs' audit trails) and the table it prints: one column per reviewer count.
``N → job line`` is the server's and Gradio's part of an opening (the key press to the job's id on the
page), ``job line → interactive`` the browser's (the panel and its canvas drawn)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from harness.bench import parse_at, pct
from harness.reviewer_page import JOB_ID
from harness.sse import read_events

ADMIN = "tok-bench-admin"  # the feeder's token, and the audit's reader


def table(results: dict[str, Any]) -> str:
    rows = [
        ("jobs decided / opened / answers", lambda r: f"{r['jobs_decided']} / {r['jobs_opened']} / {r['submissions']}"),
        ("pause → interactive p50 (ms)", lambda r: r["pause_to_interactive_p50_ms"]),
        ("pause → interactive p95 (ms)", lambda r: r["pause_to_interactive_p95_ms"]),
        ("N → interactive p50 (ms)", lambda r: r["n_to_interactive_p50_ms"]),
        ("N → interactive p95 (ms)", lambda r: r["n_to_interactive_p95_ms"]),
        ("  N → job line p50 (ms)", lambda r: r.get("n_to_job_line_p50_ms")),
        ("  job line → interactive p50", lambda r: r.get("job_line_to_interactive_p50_ms")),
        ("submit → banner p50 (ms)", lambda r: r["submit_to_banner_p50_ms"]),
        ("submit → banner p95 (ms)", lambda r: r["submit_to_banner_p95_ms"]),
        ("pause → decided p50 (ms)", lambda r: r["pause_to_decided_p50_ms"]),
        ("pause → decided p95 (ms)", lambda r: r["pause_to_decided_p95_ms"]),
        ("submissions ending in 409", lambda r: f"{r['conflicts_409']} ({(r['share_409'] or 0):.1%})"),
        ("answers not confirmed (banner)", lambda r: r["banner_not_confirmed"]),
        ("N presses finding nothing", lambda r: r["n_misses"]),
        ("wall (s)", lambda r: r["wall_s"]),
    ]
    keys = list(results)
    out = [f"{'reviewers':<32}" + "".join(f"{k:>14}" for k in keys), "-" * (32 + 14 * len(keys))]
    for label, get in rows:
        out.append(f"{label:<32}" + "".join(f"{get(results[k])!s:>14}" for k in keys))
    return "\n".join(out)


def pause_opened_at(api_url: str, job_id: str, pause: str) -> float | None:
    """The ``at`` of the PAUSE_OPENED event that opened ``pause`` (from the job's event history)."""
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30) as c:
        for ev in read_events(c, job_id, until="PAUSE_OPENED", timeout=httpx.Timeout(10, read=30)):
            if (
                ev["type"] == "PAUSE_OPENED"
                and (ev.get("data") or {}).get("active_pause", {}).get("pause_token") == pause
            ):
                return parse_at(ev["at"])
    return None


async def figures(run: Any, api: httpx.AsyncClient, api_url: str, wall: float) -> dict[str, Any]:
    """One scenario's figures (``benchmarks/reviewer.py``'s ``Run`` once its reviewers are done), with the
    server's word on every answer and odd case from the jobs' audit trails."""
    n, quorum, jobs = run.reviewers, run.quorum, run.jobs
    # The server's own word on every answer (docs/protocol.md § Audit): a page's banner can be replaced
    # before it is read (the job's end right after the deciding answer), so refusals are counted here.
    audits: dict[str, list[dict[str, Any]]] = {}
    for job in {a["job"] for a in run.answers} | {m.group(0) for o in run.odd if (m := JOB_ID.search(o["job"]))}:
        r = await api.get(f"/api/v1/jobs/{job}/audit")
        r.raise_for_status()
        audits[job] = r.json()["entries"]
    refusals = [
        f"{job} {e['actor']} {e['action']} {e['outcome']}"
        for job, entries in audits.items()
        for e in entries
        if e["action"] in ("INTERVENE", "QUORUM_VOTE") and e["outcome"].startswith("REFUSED")
    ]
    for odd in run.odd:  # who did what to the job, from its audit trail
        found = JOB_ID.search(odd["job"])
        odd["audit"] = [
            f"{e['at']} {e['actor']} {e['action']} v{e['base_version']} {e['outcome']}"
            for e in audits.get(found.group(0) if found else "", [])
        ]

    pause_ms, press_ms, decided_ms, line_ms, draw_ms = [], [], [], [], []
    opened_at: dict[tuple[str, str], float | None] = {}
    for o in run.opened:
        key = (o["job"], o["pause"])
        if key not in opened_at:
            opened_at[key] = await asyncio.to_thread(pause_opened_at, api_url, *key)
        at = opened_at[key]
        if at is not None:
            pause_ms.append((o["t"] / 1000 - at) * 1000)
        if o["pressed"] is not None:
            press_ms.append((o["t"] / 1000 - o["pressed"]) * 1000)
            line_ms.append(o["shown"] - o["pressed"] * 1000)  # the server's and Gradio's part
            draw_ms.append(o["t"] - o["shown"])  # the browser's
    for a in run.decided.values():
        at = opened_at.get((a["job"], a["pause"]))
        if at is not None and a["kind"] == "ok":
            decided_ms.append((a["t"] / 1000 - at) * 1000)
    submit_ms = [(a["t"] / 1000 - a["sent"]) * 1000 for a in run.answers]
    kinds = {k: sum(a["kind"] == k for a in run.answers) for k in ("ok", "conflict", "refused")}
    answered = len(run.answers)
    return {
        "reviewers": n,
        "quorum": quorum,
        "jobs_submitted": len(run.submitted),
        "jobs_decided": len(run.decided),
        "jobs_opened": len(run.opened),
        "submissions": answered,
        "wall_s": round(wall, 2),
        "pause_to_interactive_p50_ms": round(pct(pause_ms, 0.5), 1),
        "pause_to_interactive_p95_ms": round(pct(pause_ms, 0.95), 1),
        "n_to_interactive_p50_ms": round(pct(press_ms, 0.5), 1),
        "n_to_interactive_p95_ms": round(pct(press_ms, 0.95), 1),
        "n_to_job_line_p50_ms": round(pct(line_ms, 0.5), 1),
        "job_line_to_interactive_p50_ms": round(pct(draw_ms, 0.5), 1),
        "submit_to_banner_p50_ms": round(pct(submit_ms, 0.5), 1),
        "submit_to_banner_p95_ms": round(pct(submit_ms, 0.95), 1),
        "pause_to_decided_p50_ms": round(pct(decided_ms, 0.5), 1),
        "pause_to_decided_p95_ms": round(pct(decided_ms, 0.95), 1),
        "confirmed": kinds["ok"],
        "conflicts_409": len(refusals),  # the server's word (the audit), not the page's banner
        "banner_not_confirmed": kinds["conflict"] + kinds["refused"],
        "refused_other": kinds["refused"],
        "share_409": round(len(refusals) / answered, 4) if answered else None,
        "n_misses": run.misses,
        "n_ended_on_open": run.ended_on_open,
        "n_late_opens": run.late_opens,
        "odd": run.odd,
        "server_refusals": refusals,
        "submissions_retried_429_503": run.retried,
        "retry_answers": dict(run.retry_answers),
        "other_answers": sorted({a["text"][:120] for a in run.answers if a["kind"] != "ok"}),
        "timed_out": len(run.decided) < jobs,
    }
