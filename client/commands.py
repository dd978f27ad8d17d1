"""The client half of the ``hitl`` command line: submit, status, watch, results, jobs.

``add_client_commands(subparsers)`` registers them on the one ``hitl`` parser
(``serve_app.cli``); each sets ``func`` to a function ``(args) -> exit code``.
Tables are for people; ``--json`` is for scripts (stdout carries only JSON
then, errors included, as ``{"error": {...}}``).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from statecore.models import Event, JobResults, JobSnapshot

from .api import TERMINAL_STATUSES, HitlClient
from .batch import CATEGORIES, DEFAULT_BATCH, ENDED_WELL, BatchSummary, check_batch_name, download_outputs, run_batch
from .config import ClientConfig, resolve_config
from .errors import ApiError, AuthError, ConnectionFailed, HitlClientError, WaitTimeout
from .times import age_seconds

Handler = Callable[[argparse.Namespace], int]

EXIT_OK, EXIT_FAIL, EXIT_INTERRUPTED = 0, 1, 130
_STYLE = {
    "SUCCEEDED": "green",
    "PARTIAL_SUCCEEDED": "green",
    "EMPTY_SELECTION": "cyan",
    "FAILED": "red",
    "TIMED_OUT": "red",
    "CANCELLED": "yellow",
    "WAITING_USER_SELECTION": "magenta",
    "WAITING_BOX_BATCH_REVISION": "magenta",
}

CONNECTION_HELP = """\
The server is --api-url, else $HITL_API_URL, else http://127.0.0.1:8000. The token
is --token, else $HITL_TOKEN, else the local admin token a loopback server writes
to <data-dir>/api-token (data dir: --data-dir, else $HITL_DATA_DIR, else .hitl)."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
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


def add_client_commands(subparsers: Any) -> None:
    """Register submit, status, watch, results and jobs on ``subparsers`` (from ``add_subparsers``)."""
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
        "WAITING_BOX_BATCH_REVISION) it is the review queue, oldest pause first.",
    )
    p.add_argument("--status", metavar="S", help="only jobs in status S, e.g. WAITING_USER_SELECTION, SUCCEEDED")
    p.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="at most N jobs (default: 50)")
    p.add_argument("--cursor", help="continue after a previous page (the next_cursor it printed)")


# ---------------------------------------------------------------------- plumbing


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def _config(args: argparse.Namespace) -> ClientConfig:
    return resolve_config(args.api_url, args.token, args.data_dir)


def _styled(status: str | None) -> Text:
    return Text(status or "-", style=_STYLE.get(status or "", ""))


def _client_command(fn: Callable[[argparse.Namespace, HitlClient], int]) -> Handler:
    """Open a client for the command and turn client errors into a message and exit status 1."""

    @wraps(fn)
    def run(args: argparse.Namespace) -> int:
        cfg = _config(args)
        try:
            with HitlClient.from_config(cfg) as client:
                return fn(args, client)
        except KeyboardInterrupt:
            _err().print("interrupted")
            return EXIT_INTERRUPTED
        except HitlClientError as exc:
            _report_error(args, cfg, exc)
            return EXIT_FAIL

    return run


def _report_error(args: argparse.Namespace, cfg: ClientConfig, exc: HitlClientError) -> None:
    hint = ""
    if isinstance(exc, AuthError) and exc.status_code == 401:
        hint = (
            f"token from {cfg.token_source}"
            if cfg.token_source
            else "no token found: pass --token, set HITL_TOKEN, or point --data-dir at the server's data dir"
        )
    elif isinstance(exc, ConnectionFailed):
        hint = f"is the server running at {cfg.api_url}? (--api-url / HITL_API_URL)"
    if args.json:
        err: dict[str, Any] = {"message": str(exc)}
        if isinstance(exc, ApiError):
            err.update(status_code=exc.status_code, code=exc.code, message=exc.message, snapshot=exc.snapshot)
        if hint:
            err["hint"] = hint
        _print_json({"error": err})
        return
    console = _err()
    console.print(f"[red]error:[/red] {exc}", markup=True)
    if isinstance(exc, ApiError) and exc.snapshot:
        console.print(f"the job is now {exc.snapshot.get('status')} (version {exc.snapshot.get('version')})")
    if hint:
        console.print(hint)


def _age(iso: str | None) -> str:
    seconds = age_seconds(iso)
    if seconds is None:
        return "-"
    secs = int(seconds)
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h{(secs % 3600) // 60:02d}m"
    return f"{secs // 86400}d"


# ---------------------------------------------------------------------- submit


def cmd_submit(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if args.manifest:
        manifest = args.manifest
    elif args.out:
        manifest = args.out / "manifest.jsonl"
    else:
        manifest = cfg.data_dir / "batches" / f"{args.batch}.jsonl"
    err = _err()
    try:
        check_batch_name(args.batch)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return EXIT_FAIL
    if args.out and not args.wait:
        err.print("[yellow]note:[/yellow] --out takes effect with --wait (cut-outs exist once a job has ended)")
    try:
        with HitlClient.from_config(cfg) as client:
            summary = run_batch(
                client,
                args.inputs,
                batch=args.batch,
                concurrency=args.concurrency,
                wait=args.wait,
                out=args.out,
                manifest=manifest,
                timeout=args.timeout,
                progress=not (args.json or args.no_progress) and err.is_terminal,
                console=err,
            )
    except KeyboardInterrupt:
        err.print("interrupted: run the same command again to resume")
        return EXIT_INTERRUPTED
    if args.json:
        _print_json(summary.to_dict())
    else:
        _print_submit_summary(summary, err)
    return summary.exit_code


def _print_submit_summary(summary: BatchSummary, err: Console) -> None:
    out = Console(highlight=False)
    for s in summary.skipped:
        err.print(f"[yellow]skipped[/yellow] {s.path}: {s.reason}")
    if summary.files:
        table = Table(title=f"batch {summary.batch}", title_justify="left")
        table.add_column("file", overflow="fold")
        table.add_column("job", no_wrap=True)
        table.add_column("status", no_wrap=True)
        table.add_column("note", overflow="fold")
        for f in summary.files:
            notes = []
            if f.resumed:
                notes.append("from manifest")
            elif f.replayed:
                notes.append("already submitted")
            if f.error:
                notes.append(f.error)
            elif f.out_dir and f.final_status:
                notes.append(f"→ {f.out_dir}")
            table.add_row(str(f.path), f.job_id or "-", _styled(f.final_status or f.status or None), "; ".join(notes))
        out.print(table)
    counts = summary.counts()
    line = ", ".join(f"{counts[c]} {c}" for c in CATEGORIES if c in counts) or "no images"
    if summary.skipped:
        line += f", {len(summary.skipped)} skipped"
    out.print(line)
    if summary.manifest:
        out.print(f"manifest: {summary.manifest}")
    if summary.aborted:
        err.print(f"[red]stopped early:[/red] {summary.aborted}")
    if summary.interrupted:
        err.print("[yellow]interrupted[/yellow]: run the same command again to resume")


# ---------------------------------------------------------------------- status


@_client_command
def cmd_status(args: argparse.Namespace, client: HitlClient) -> int:
    snap = client.get_job(args.job_id)
    if args.json:
        _print_json(snap.model_dump(mode="json"))
    else:
        print_snapshot(snap, Console(highlight=False))
    return EXIT_OK


def print_snapshot(snap: JobSnapshot, console: Console) -> None:
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    info.add_row("job", snap.job_id)
    info.add_row("status", _styled(str(snap.status)))
    info.add_row("version", str(snap.version))
    info.add_row("round", str(snap.round))
    info.add_row("created", snap.created_at)
    info.add_row("updated", snap.updated_at)
    info.add_row("image", f"{snap.image.width}×{snap.image.height}  sha256 {snap.image.sha256[:12]}…  {snap.image.url}")
    if snap.reason_code:
        info.add_row("reason", snap.reason_code)
    if snap.cancel_requested:
        info.add_row("cancel", "requested")
    if snap.current_node:
        n = snap.current_node
        info.add_row("node", f"{n.node_type} {n.status} (attempt {n.attempt}, {n.node_instance_id})")
    if snap.active_pause:
        p = snap.active_pause
        pause = (
            f"{p.stage} round {p.round}, token {p.pause_token}, base version {p.base_version}, "
            f"waiting {_age(p.created_at)}"
        )
        if p.box_ids_to_revise:
            pause += f", to revise: {', '.join(p.box_ids_to_revise)}"
        info.add_row("pause", pause)
    if snap.pending_actions:
        info.add_row("actions", ", ".join(snap.pending_actions))
    console.print(info)
    if snap.box_list or snap.approved_box_list:
        approved = {b.box_id for b in snap.approved_box_list}
        boxes = {b.box_id: b for b in [*snap.box_list, *snap.approved_box_list]}
        table = Table(title="boxes", title_justify="left")
        for col in ("box", "label", "score", "bbox", "source", "policy", "validation", "approved"):
            table.add_column(col)
        for b in boxes.values():
            v = b.validation
            table.add_row(
                b.box_id,
                b.label or "-",
                f"{b.score:.2f}" if b.score is not None else "-",
                "[" + ", ".join(f"{x:g}" for x in b.bbox) + "]",
                b.source,
                b.target_policy,
                f"{v.status} {v.score:.2f}" if v and v.score is not None else (v.status if v else "-"),
                "yes" if b.box_id in approved else "",
            )
        console.print(table)


# ---------------------------------------------------------------------- watch


def format_event(event: Event) -> str:
    """One readable line per event."""
    data = dict(event.data)
    status = data.pop("status", None)
    detail = ""
    if event.type == "PAUSE_OPENED":
        pause = data.get("active_pause") or {}
        detail = (
            f"pause {pause.get('pause_token', '?')} {pause.get('stage', '')} round {pause.get('round', '?')}, "
            f"{len(data.get('box_list') or [])} boxes"
        )
    elif data:
        detail = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
        if len(detail) > 160:
            detail = detail[:157] + "..."
    parts = [f"#{event.id}", event.at or "-", event.type]
    if status:
        parts.append(str(status))
    parts.append(f"v{event.version}")
    if detail:
        parts.append(detail)
    return "  ".join(parts)


@_client_command
def cmd_watch(args: argparse.Namespace, client: HitlClient) -> int:
    console = Console(highlight=False)
    final: str | None = None
    for event in client.events(args.job_id, args.last_event_id):
        if args.json:
            _print_json(event.model_dump(mode="json"))
        else:
            console.print(
                Text(format_event(event), style=_STYLE.get(str(event.data.get("status")), "")), soft_wrap=True
            )
        if event.type == "JOB_FINISHED":
            final = str(event.data.get("status") or "")
    if final is None or final not in TERMINAL_STATUSES:
        final = str(client.get_job(args.job_id).status)
    return EXIT_OK if final in ENDED_WELL else EXIT_FAIL


# ---------------------------------------------------------------------- results


@_client_command
def cmd_results(args: argparse.Namespace, client: HitlClient) -> int:
    if args.wait:
        try:
            client.wait_for(args.job_id, timeout=args.timeout)
        except WaitTimeout as exc:
            _report_error(args, _config(args), exc)
            return EXIT_FAIL
    try:
        res = client.results(args.job_id)
    except ApiError as exc:
        if exc.code == "JOB_NOT_FINISHED" and not args.json:
            status = exc.snapshot.get("status") if exc.snapshot else "not finished"
            _err().print(f"job {args.job_id} is {status}; results exist once it ends (add --wait to wait)")
            return EXIT_FAIL
        raise
    written = download_outputs(client, res, args.out) if args.out else []
    if args.json:
        _print_json({**res.model_dump(mode="json"), "files": [str(p) for p in written]})
    else:
        print_results(res, Console(highlight=False))
        if args.out:
            Console(highlight=False).print(f"{len(written)} files written to {args.out}")
    return EXIT_OK


def print_results(res: JobResults, console: Console) -> None:
    title = f"{res.job_id}  {res.status}" + (f"  ({res.reason_code})" if res.reason_code else "")
    table = Table(title=title, title_justify="left")
    for col in ("box", "label", "status", "bbox", "reason", "mask", "cut-out"):
        table.add_column(col, overflow="fold")
    for s in res.subjects:
        table.add_row(
            s.box_id,
            s.label or "-",
            _styled(s.status),
            "[" + ", ".join(f"{x:g}" for x in s.bbox) + "]",
            s.reason or "",
            s.mask_url or "-",
            s.cutout_url or "-",
        )
    console.print(table)


# ---------------------------------------------------------------------- jobs


@_client_command
def cmd_jobs(args: argparse.Namespace, client: HitlClient) -> int:
    page = client.list_jobs(args.status, args.limit, args.cursor)
    if args.json:
        _print_json(page.model_dump(mode="json"))
        return EXIT_OK
    table = Table()
    table.add_column("job", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col in ("version", "created", "stage", "waiting", "boxes", "submitter"):
        table.add_column(col)
    for j in page.jobs:
        table.add_row(
            j.job_id,
            _styled(str(j.status)),
            str(j.version),
            j.created_at,
            j.stage or "",
            _age(j.pause_created_at) if j.pause_created_at else "",
            str(j.box_count),
            j.submitter,
        )
    console = Console(highlight=False)
    console.print(table)
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")
    return EXIT_OK
