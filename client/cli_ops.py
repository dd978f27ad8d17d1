"""Operating stale waits (seed 000: "撤销、提醒和运营清理"; docs/protocol.md § Audit): ``hitl cancel
JOB…`` and ``hitl admin stale``. A pause never times out (nothing acts on a waiting job by itself),
so the people who run the service find the waits nobody is working and end them, by hand, with a
reason each job's audit keeps. Both go through the API with the client, as every other command."""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console
from rich.table import Table

from hitl_review.statecore.models import JobSummary

from .api import HitlClient
from .cli_common import EXIT_FAIL, EXIT_OK, age_text, client_command, print_json
from .errors import ApiError, HitlClientError
from .times import age_seconds

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
# The audit actions of a person looking at a waiting job: who last did one "looked" (docs/protocol.md § Audit).
LOOKS = ("CLAIM", "RELEASE", "SKIP", "INTERVENE", "QUORUM_VOTE", "QUORUM_DISAGREED", "FLAG", "UNFLAG", "COMMENT")


def parse_age(text: str) -> float:
    """``14d``, ``36h``, ``90m``, ``45s`` (a number and one unit) → seconds; argparse's error otherwise."""
    m = AGE.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age: a number and a unit, s m h or d (e.g. 14d, 36h)")
    return float(m.group(1)) * UNITS[m.group(2)]


def job_ids_from(args: argparse.Namespace) -> list[str]:
    """The jobs named on the command line, then those of ``--from FILE`` (one per line; blank lines
    and ``#`` comments skipped; ``-`` is stdin), each once, in order."""
    ids = list(args.job_ids)
    if args.from_file:
        with sys.stdin if args.from_file == "-" else open(args.from_file, encoding="utf-8") as f:
            ids += [line.split("#", 1)[0].strip() for line in f]
    return list(dict.fromkeys(i for i in ids if i))


def cancel_each(
    client: HitlClient, job_ids: Iterable[str], reason: str | None, say: Callable[[dict[str, Any]], None]
) -> int:
    """Cancel each job (``reason`` in its audit entry), telling ``say`` each outcome as it comes:
    ``{"job_id", "outcome": "CANCELLED"|"FAILED", "version" | "status_code", "code", "message"}``.
    Returns how many failed."""
    failed = 0
    for job_id in job_ids:
        try:
            snap = client.cancel(job_id, reason)
            say({"job_id": job_id, "outcome": str(snap.status), "version": snap.version})
        except HitlClientError as exc:
            failed += 1
            code = exc.code if isinstance(exc, ApiError) else type(exc).__name__
            status = exc.status_code if isinstance(exc, ApiError) else None
            say({"job_id": job_id, "outcome": "FAILED", "status_code": status, "code": code, "message": str(exc)})
    return failed


def _line(done: dict[str, Any]) -> str:
    if done["outcome"] == "FAILED":
        status = f"{done['status_code']} " if done.get("status_code") else ""
        return f"{done['job_id']} FAILED {status}{done['code']}: {done['message']}"
    return f"{done['job_id']} {done['outcome']} (version {done['version']})"


@client_command
def cmd_cancel(args: argparse.Namespace, client: HitlClient) -> int:
    ids = job_ids_from(args)
    if not ids:
        raise SystemExit("hitl cancel: name jobs (JOB …) or give --from FILE")
    console = Console(highlight=False)
    failed = cancel_each(
        client,
        ids,
        args.reason,
        (lambda d: print_json(d)) if args.json else (lambda d: console.print(_line(d), markup=False, soft_wrap=True)),
    )
    return EXIT_FAIL if failed else EXIT_OK


def last_looked(client: HitlClient, job: JobSummary) -> dict[str, Any] | None:
    """Who last looked at a waiting job: its live claim, else the last person's action in its audit
    (``{"reviewer", "at", "how"}``), None when nobody has."""
    if job.claim is not None:
        return {"reviewer": job.claim.reviewer, "at": None, "how": "claims it now"}
    entries = client.audit(job.job_id).get("entries", [])
    seen = next((e for e in reversed(entries) if e.get("action") in LOOKS), None)
    if seen is None:
        return None
    return {"reviewer": seen["actor"], "at": seen["at"], "how": f"{seen['action']} {seen['outcome']}"}


def stale_jobs(client: HitlClient, older_than_s: float) -> list[JobSummary]:
    """The waiting jobs whose pause is older than ``older_than_s``: the review queue is listed oldest
    pause first, so the listing stops at the first younger one."""
    found = []
    for job in client.iter_jobs("WAITING"):
        age = age_seconds(job.pause_created_at)
        if age is None:  # no pause time to judge by (never so for a waiting job): not listed
            continue
        if age < older_than_s:
            break
        found.append(job)
    return found


@client_command
def cmd_stale(args: argparse.Namespace, client: HitlClient) -> int:
    if args.cancel and not args.reason:
        raise SystemExit("hitl admin stale: --cancel needs --reason TEXT (each job's audit keeps it)")
    jobs = stale_jobs(client, args.waiting_older_than)
    by_stage = Counter(str(j.stage or j.status) for j in jobs)
    rows: list[dict[str, Any]] = [
        {
            "job_id": j.job_id,
            "stage": str(j.stage or j.status),
            "pause_created_at": j.pause_created_at,
            "waiting_s": round(age_seconds(j.pause_created_at) or 0.0),
            "submitter": j.submitter,
            "last_looked": last_looked(client, j),
        }
        for j in jobs
    ]
    acting = args.cancel and not args.dry_run
    outcomes: dict[str, dict[str, Any]] = {}
    failed = 0
    if acting:
        ids = [r["job_id"] for r in rows]
        failed = cancel_each(client, ids, args.reason, lambda d: outcomes.update({d["job_id"]: d}))
    if args.json:
        for r in rows:
            if r["job_id"] in outcomes:
                r["outcome"] = outcomes[r["job_id"]]
        print_json(
            {
                "older_than_s": args.waiting_older_than,
                "count": len(rows),
                "by_stage": dict(sorted(by_stage.items())),
                "jobs": rows,
                "cancelled": len(outcomes) - failed if acting else 0,
                "would_cancel": len(rows) if args.cancel and args.dry_run else 0,
                "failed": failed,
            }
        )
        return EXIT_FAIL if failed else EXIT_OK
    _print_stale(args, rows, by_stage, outcomes)
    return EXIT_FAIL if failed else EXIT_OK


def _print_stale(
    args: argparse.Namespace, rows: list[dict[str, Any]], by_stage: Counter[str], outcomes: dict[str, dict[str, Any]]
) -> None:
    console = Console(highlight=False)
    age = age_text_of(args.waiting_older_than)
    console.print(f"{len(rows)} waiting job(s) whose pause is older than {age}", markup=False)
    for stage, n in sorted(by_stage.items()):
        console.print(f"  {stage}: {n}", markup=False)
    if not rows:
        return
    acting = bool(outcomes) or args.cancel
    table = Table(box=None, pad_edge=False)
    table.add_column("job", no_wrap=True, min_width=len(rows[0]["job_id"]))  # whole: to copy it
    for name in ("stage", "waiting", "submitter", "last looked", *(("outcome",) if acting else ())):
        table.add_column(name)
    for r in rows:
        seen = r["last_looked"]
        looked = "nobody" if seen is None else f"{seen['reviewer']}: {seen['how']}{_ago(seen['at'])}"
        done = outcomes.get(r["job_id"])
        outcome = "would cancel" if not done else done["outcome"]
        if done and done["outcome"] == "FAILED":
            outcome = f"FAILED {done['code']}"
        stage = r["stage"].removeprefix("WAITING_")
        cells = [r["job_id"], stage, age_text(r["pause_created_at"]), r["submitter"], looked]
        table.add_row(*cells, *((outcome,) if acting else ()))
    console.print(table)
    if args.cancel and args.dry_run:
        console.print(f"dry run: would cancel {len(rows)} job(s) with reason {args.reason!r}", markup=False)
    elif outcomes:
        failed = sum(d["outcome"] == "FAILED" for d in outcomes.values())
        console.print(f"cancelled {len(outcomes) - failed}, failed {failed}", markup=False)


def _ago(at: str | None) -> str:
    return f" ({age_text(at)} ago)" if at else ""


def age_text_of(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= UNITS[unit] and seconds % UNITS[unit] == 0:
            return f"{int(seconds // UNITS[unit])}{unit}"
    return f"{seconds:g}s"


def add_ops_commands(subparsers: Any, admin_sub: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``hitl cancel`` on ``subparsers`` and ``hitl admin stale`` on ``admin_sub``, through
    ``command`` (``client.commands._command``: the connection options and help)."""
    p = command(
        subparsers,
        "cancel",
        cmd_cancel,
        help="cancel jobs (ids, or a file of them)",
        description="Cancel each job named, and each of --from FILE (one job id per line; blank lines and # "
        "comments skipped; - reads stdin). A cancel is idempotent: a job already cancelled answers CANCELLED "
        "again. Prints one line per job with its outcome; a job that ended otherwise (409 JOB_TERMINAL), an "
        "unknown one (404) or a refused one is a FAILED line and the command goes on with the next. --reason "
        "is kept in each job's audit entry (hitl's audit: GET /jobs/{id}/audit).",
        epilog="exit status: 0 when every job was cancelled (or already was), 1 when any failed.\n\n"
        "examples:\n  hitl cancel job_1a2b… job_3c4d… --reason 'customer withdrew the order'\n"
        "  hitl admin stale --waiting-older-than 14d --json | jq -r '.jobs[].job_id' > stale.txt\n"
        "  hitl cancel --from stale.txt --reason 'nobody reviewed it in 14 days'",
    )
    p.add_argument("job_ids", nargs="*", metavar="JOB", help="the jobs to cancel (job_…)")
    p.add_argument("--from", dest="from_file", metavar="FILE", help="also the job ids in FILE, one a line (- = stdin)")
    p.add_argument("--reason", metavar="TEXT", help="why, kept in each job's audit (1-500 characters)")

    p = command(
        admin_sub,
        "stale",
        cmd_stale,
        help="list (and cancel) the waiting jobs whose pause is older than an age",
        description="List the jobs waiting on a person whose pause was opened longer ago than "
        "--waiting-older-than (a pause never times out: nothing ends such a job but a person), oldest first: "
        "how many per stage (WAITING_USER_SELECTION, WAITING_BOX_BATCH_REVISION, WAITING_MASK_REVIEW), and "
        "for each job how long it has waited, who submitted it and who last looked (the reviewer claiming it "
        "now, else the last person's claim, release, skip, answer, flag or comment in its audit). With "
        "--cancel --reason TEXT, cancel them (the reason kept in each job's audit; one line per job); with "
        "--dry-run, say what --cancel would cancel and change nothing. The alert HitlReviewUnwatched "
        "(deploy/prometheus/rules.yml) points here.",
        epilog="exit status: 0; with --cancel, 1 when any cancel failed.\n\n"
        "examples:\n  hitl admin stale --waiting-older-than 14d\n"
        "  hitl admin stale --waiting-older-than 14d --cancel --reason 'unreviewed for 14 days' --dry-run\n"
        "  hitl admin stale --waiting-older-than 14d --cancel --reason 'unreviewed for 14 days'",
    )
    p.add_argument(
        "--waiting-older-than",
        type=parse_age,
        required=True,
        metavar="AGE",
        help="the pause's age: a number and a unit, s m h or d (e.g. 14d, 36h, 90m)",
    )
    p.add_argument("--cancel", action="store_true", help="cancel every job listed (needs --reason)")
    p.add_argument("--reason", metavar="TEXT", help="with --cancel: why, kept in each job's audit (1-500 characters)")
    p.add_argument("--dry-run", action="store_true", help="with --cancel: only say what would be cancelled")
