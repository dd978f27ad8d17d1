"""The client half of the ``hitl`` command line: submit, status, watch, results, jobs.

``add_client_commands(subparsers)`` registers them on the one ``hitl`` parser
(``serve_app.cli``); each sets ``func`` to a function ``(args) -> exit code``.
Tables are for people; ``--json`` is for scripts (stdout carries only JSON
then, errors included, as ``{"error": {...}}``).

The commands themselves live in ``client.cli_submit`` (submit) and
``client.cli_jobs`` (status, watch, results, jobs), on what they share in
``client.cli_common``; this module builds their argument parsers.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

from .batch import DEFAULT_BATCH, check_batch_name
from .cli_admin import cmd_dead_letters, cmd_gc_artifacts, cmd_reconcile, cmd_replay, cmd_verify_audit, cmd_webhooks
from .cli_common import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, Handler
from .cli_jobs import cmd_jobs, cmd_results, cmd_status, cmd_watch, format_event, print_results, print_snapshot
from .cli_notes import cmd_comment, cmd_flag
from .cli_ops import add_ops_commands
from .cli_reviewers import add_reviewer_commands
from .cli_submit import cmd_submit

__all__ = [
    "EXIT_FAIL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "HelpFormatter",
    "add_client_commands",
    "cmd_jobs",
    "cmd_results",
    "cmd_status",
    "cmd_submit",
    "cmd_watch",
    "format_event",
    "print_results",
    "print_snapshot",
]

CONNECTION_HELP = """\
The server is --api-url, else $HITL_API_URL, else http://127.0.0.1:8000. The token
is --token, else $HITL_TOKEN, else the local admin token a loopback server writes
to <data-dir>/api-token (data dir: --data-dir, else $HITL_DATA_DIR, else .hitl)."""


def _positive_int(text: str) -> int:
    """A count of at least 1 (its errors say the value, never this function's name: argparse's
    ``invalid <type name> value`` is only for a ``ValueError``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def _positive_float(text: str) -> float:
    """A number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive number of seconds")
    return value


def _batch_name(text: str) -> str:
    try:
        return check_batch_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    conn = parent.add_argument_group("connection")
    conn.add_argument("--api-url", metavar="URL", help="server URL (default: $HITL_API_URL or http://127.0.0.1:8000)")
    conn.add_argument("--token", help="API token (default: $HITL_TOKEN, else <data-dir>/api-token)")
    conn.add_argument(
        "--data-dir",
        metavar="DIR",
        help="data directory whose api-token file is used (default: $HITL_DATA_DIR or .hitl)",
    )
    parent.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    return parent


class HelpFormatter(argparse.HelpFormatter):
    """Wraps each paragraph of a description or epilog to the terminal; keeps indented lines (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith(" ") for line in lines[1:]) or para.startswith(" "):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(
                    textwrap.fill(
                        " ".join(lines), width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
                    )
                )
        return "\n\n".join(paragraphs)


def _command(
    subparsers: Any, name: str, func: Handler, *, help: str, description: str, epilog: str = "", job: bool = False
) -> argparse.ArgumentParser:
    """A client subcommand: the connection options, the connection help, and ``func`` to run it."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        name,
        parents=[_common()],
        formatter_class=HelpFormatter,
        help=help,
        description=description,
        epilog=f"{epilog}\n\n{CONNECTION_HELP}" if epilog else CONNECTION_HELP,
    )
    if job:
        p.add_argument("job_id", metavar="JOB", help="the job's id (job_…), as submit and jobs print it")
    p.set_defaults(func=func)
    return p


def add_client_commands(subparsers: Any) -> Any:
    """Register submit, status, watch, results, jobs and admin on ``subparsers`` (from
    ``add_subparsers``); the ``admin`` subparsers, for the server's own admin commands."""
    p = _command(
        subparsers,
        "submit",
        cmd_submit,
        help="submit images (files or directories) for review",
        description="Submit images for review. Directories are walked recursively; files are recognised by "
        "content (PNG, JPEG, WebP) and anything else is reported by name and skipped.\n\n"
        "Each file's Idempotency-Key is <batch>:<sha256 of its bytes>, so rerunning the same command "
        "never creates a second job. A manifest (JSONL) records every step; a rerun skips finished "
        "files and only waits for the ones already submitted, so an interrupted run is resumed by "
        "running the same command again.",
        epilog="exit status: 0 only when every file was accepted (and, with --wait, ended SUCCEEDED, "
        "PARTIAL_SUCCEEDED or EMPTY_SELECTION); 1 otherwise; 130 when interrupted.\n\n"
        "examples:\n  hitl submit photos/ --wait --out cutouts/\n"
        "  hitl submit a.png b.jpg --batch spring-sale --json",
    )
    p.add_argument("inputs", nargs="+", metavar="IMAGE_OR_DIR", help="image files or directories of images")
    p.add_argument(
        "--batch",
        type=_batch_name,
        default=DEFAULT_BATCH,
        help=f"batch name, part of every Idempotency-Key; the same file in another batch is a new job "
        f"(default: {DEFAULT_BATCH})",
    )
    p.add_argument(
        "--concurrency", type=_positive_int, default=4, metavar="N", help="files uploaded in parallel (default: 4)"
    )
    p.add_argument(
        "--quorum",
        type=_positive_int,
        default=1,
        metavar="N",
        help="each review needs N distinct reviewers whose box lists agree; a disagreement opens a "
        "reconciliation review showing their lists side by side (default: 1, at most 10)",
    )
    p.add_argument(
        "--quorum-policy",
        choices=("all", "majority", "any"),
        default="all",
        help="with --quorum N: all N must agree (default), a majority of them (more than half), or "
        "the first submission decides",
    )
    p.add_argument(
        "--boxes",
        type=Path,
        metavar="FILE",
        help="pre-labelled jobs: boxes from another system, as the model's proposal (no detector call): "
        "a COCO .json (annotations of each image by file name), a YOLO .txt or a folder of YOLO "
        "<image stem>.txt (class cx cy w h, normalised)",
    )
    p.add_argument(
        "--classes",
        metavar="NAMES",
        help="with YOLO --boxes: the class names by index, comma-separated or a file (one a line, or a "
        "data.yaml's names: [...]); without it the class index is the label",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="follow every job to its end (through its event stream) before exiting; jobs that wait "
        "for a reviewer keep the command waiting",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="with --wait: write masks, cut-outs and results.json to DIR/<file-stem>/",
    )
    p.add_argument(
        "--manifest",
        type=Path,
        metavar="PATH",
        help="manifest JSONL (default: DIR/manifest.jsonl with --out, else <data-dir>/batches/<batch>.jsonl)",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="S",
        help="with --wait: stop waiting after S seconds in all; unfinished jobs are picked up by a rerun "
        "(default: no limit)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    _command(
        subparsers,
        "status",
        cmd_status,
        job=True,
        help="show one job",
        description="Show a job: status, version, the active pause (what a reviewer is asked) and the boxes.",
    )

    p = _command(
        subparsers,
        "watch",
        cmd_watch,
        job=True,
        help="follow a job's events live",
        description="Print the job's events as they happen (its history first), one line each, until the job "
        "finishes. The stream reconnects by itself without repeating events.",
        epilog="exit status: 0 when the job ended SUCCEEDED, PARTIAL_SUCCEEDED or EMPTY_SELECTION, 1 otherwise.",
    )
    p.add_argument("--last-event-id", type=int, metavar="ID", help="start after this event id (skip the history)")

    p = _command(
        subparsers,
        "results",
        cmd_results,
        job=True,
        help="show a finished job's results and download them",
        description="Show a finished job's subjects; with --out, download mask_<box_id>.png, "
        "cutout_<box_id>.png and results.json into DIR. Results exist once the job has ended.",
    )
    p.add_argument("--out", type=Path, metavar="DIR", help="download the masks and cut-outs into DIR")
    p.add_argument("--wait", action="store_true", help="wait for the job to finish first")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=3600.0,
        metavar="S",
        help="with --wait: give up after S seconds (default: 3600)",
    )

    p = _command(
        subparsers,
        "jobs",
        cmd_jobs,
        help="list jobs, or the review queue",
        description="List the jobs you may see, newest first. With --status WAITING_USER_SELECTION (or "
        "WAITING_BOX_BATCH_REVISION, WAITING_MASK_REVIEW, or WAITING for all three) it is the review queue, "
        "oldest pause first.",
    )
    p.add_argument("--status", metavar="S", help="only jobs in status S, e.g. WAITING_USER_SELECTION, SUCCEEDED")
    p.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="at most N jobs (default: 50)")
    p.add_argument("--cursor", help="continue after a previous page (the next_cursor it printed)")
    p.add_argument("--flagged", action="store_true", help="only the waiting jobs flagged for a lead")

    p = _command(
        subparsers,
        "flag",
        cmd_flag,
        job=True,
        help="flag a waiting job for a lead (or take the flag off)",
        description="Flag a waiting job for a lead, with why: it stays in the review queue, shows the flag, "
        "and `hitl jobs --flagged` lists it. --remove takes the flag off. Audited.",
    )
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--reason", metavar="TEXT", help="why a lead should look (1-500 characters)")
    group.add_argument("--remove", action="store_true", help="take the flag off")
    p = _command(
        subparsers,
        "comment",
        cmd_comment,
        job=True,
        help="comment on a live job for the next reviewer",
        description="Add a comment to a live job; the next reviewer sees it on the page and in `hitl status`. Audited.",
    )
    p.add_argument("text", metavar="TEXT", help="the comment (1-2000 characters)")

    admin = subparsers.add_parser(
        "admin",
        formatter_class=HelpFormatter,
        help="operator commands (admin token): dead letters, reconcile, audit, stale waits, artifact GC, accounts",
        description="Operator commands; they need an admin token.",
    )
    admin_sub = admin.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND", required=True)
    _command(
        admin_sub,
        "dead-letters",
        cmd_dead_letters,
        help="list the dead letters",
        description="List the node results and commands given up on after their retries (a result Redis could "
        "not take in time, a command delivered more than --max-deliveries times), oldest first, with the reason.",
    )
    p = _command(
        admin_sub,
        "webhooks",
        cmd_webhooks,
        help="the webhooks' delivery log",
        description="The newest webhook delivery attempts, newest first (delivered, failed and retried, gave_up; "
        "the HTTP status or the error), and how many deliveries wait (docs/protocol.md § Webhooks).",
    )
    p.add_argument("--limit", type=int, default=100, metavar="N", help="show the newest N attempts (1..1000)")
    p = _command(
        admin_sub,
        "replay",
        cmd_replay,
        help="replay one dead letter",
        description="Replay a dead letter and remove it: a result goes through the normal report path (APPLIED; "
        "REPORT_IGNORED when its job ended or moved on meanwhile; DUPLICATE), a command is queued again "
        "(REQUEUED).",
    )
    p.add_argument("dead_letter_id", metavar="ID", help="the dead letter's id (dl_…), as dead-letters prints it")
    _command(
        admin_sub,
        "reconcile",
        cmd_reconcile,
        help="restore the live jobs Redis lost, from the archive",
        description="After Redis lost live jobs (a restart without persistence, a failover to an empty replica): "
        "restore every job the archive's live mirror holds and Redis does not. A job waiting on a person gets a "
        "fresh pause (the old token is refused), a job in model work gets its node dispatched again; a consumed "
        "pause is never reopened. Prints what it did per outcome (RESTORED, PRESENT, ARCHIVED, NOTHING_TO_RUN).",
    )
    p = _command(
        admin_sub,
        "verify-audit",
        cmd_verify_audit,
        help="check the audit logs' hash chains; exit 1 on a broken one",
        description="Verify each job's audit log (docs/protocol.md § Audit) in every copy there is, Redis's and "
        "the archive's: each entry's hash over its content and the previous entry's hash, the entries' numbering, "
        "and the recorded head. An edited, removed or reordered entry is named (job, copy, entry, why) and the "
        "command exits 1; 0 when every chain verifies.",
    )
    p.add_argument("job_ids", nargs="*", metavar="JOB", help="the jobs to check (job_…)")
    p.add_argument("--all", action="store_true", help="check every job Redis or the archive holds")
    p = _command(
        admin_sub,
        "gc-artifacts",
        cmd_gc_artifacts,
        help="delete the images, masks and cut-outs of old archived jobs",
        description="Delete from the artifact store the blobs that only archived jobs finished more than D days "
        "ago refer to. A blob a job Redis holds (live, or finished within its retention) or a more recent archived "
        "job refers to is kept (blobs are content-addressed: one image submitted twice is one file), and so is one "
        "written within the last hour. The archive keeps its rows: reading a collected blob answers 404.",
    )
    p.add_argument("--older-than-days", type=float, required=True, metavar="D", help="jobs finished over D days ago")
    p.add_argument("--dry-run", action="store_true", help="only say what would be deleted")
    add_reviewer_commands(admin_sub, _command, HelpFormatter)
    add_ops_commands(subparsers, admin_sub, _command)  # hitl cancel, hitl admin stale
    return admin_sub
