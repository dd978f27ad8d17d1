"""The table ``benchmarks/reviewer.py`` prints: one column per reviewer count, the figures of its run.
``N → job line`` is the server's and Gradio's part of an opening (the key press to the job's id on the
page), ``job line → interactive`` the browser's (the panel and its canvas drawn)."""

from __future__ import annotations

from typing import Any


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
