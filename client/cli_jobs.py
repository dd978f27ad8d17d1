"""The commands about jobs already submitted: ``hitl status``, ``watch``, ``results`` and ``jobs``."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hitl_review.statecore.models import Event, JobResults, JobSnapshot, SubjectResult

from .api import TERMINAL_STATUSES, HitlClient
from .batch import ENDED_WELL, download_outputs
from .cli_common import (
    EXIT_FAIL,
    EXIT_OK,
    STATUS_STYLE,
    age_text,
    client_command,
    config_of,
    error_console,
    print_json,
    report_error,
    styled,
)
from .errors import ApiError, WaitTimeout

# ---------------------------------------------------------------------- status


@client_command
def cmd_status(args: argparse.Namespace, client: HitlClient) -> int:
    snap = client.get_job(args.job_id)
    if args.json:
        print_json(snap.model_dump(mode="json"))
    else:
        print_snapshot(snap, Console(highlight=False))
    return EXIT_OK


def print_snapshot(snap: JobSnapshot, console: Console) -> None:
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    info.add_row("job", snap.job_id)
    info.add_row("status", styled(str(snap.status)))
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
    for n in snap.subject_nodes:  # one per subject being cut, side by side
        info.add_row("subject node", f"{n.box_id}: {n.status} (attempt {n.attempt}, {n.node_instance_id})")
    if snap.active_pause:
        p = snap.active_pause
        pause = (
            f"{p.stage} round {p.round}, token {p.pause_token}, base version {p.base_version}, "
            f"waiting {age_text(p.created_at)}"
        )
        if p.box_ids_to_revise:
            pause += f", to revise: {', '.join(p.box_ids_to_revise)}"
        info.add_row("pause", pause)
    if snap.pending_actions:
        info.add_row("actions", ", ".join(snap.pending_actions))
    if snap.flag:
        info.add_row("flag", f"{snap.flag.by} ({age_text(snap.flag.at)}): {snap.flag.reason}")
    for c in snap.comments:
        info.add_row("comment", f"{c.by} ({age_text(c.at)}): {c.text}")
    console.print(info)
    if snap.active_pause and snap.active_pause.subjects_to_review:
        review = Table(title="cut-outs to review", title_justify="left")
        for col in ("box", "label", "verdict", "why"):
            review.add_column(col)
        for s in snap.active_pause.subjects_to_review:
            q = s.quality
            why = "; ".join(q.reasons) if q else (s.reason or "")
            review.add_row(s.box_id, s.label or "-", q.verdict if q else "-", why)
        console.print(review)
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


@client_command
def cmd_watch(args: argparse.Namespace, client: HitlClient) -> int:
    console = Console(highlight=False)
    final: str | None = None
    for event in client.events(args.job_id, args.last_event_id):
        if args.json:
            print_json(event.model_dump(mode="json"))
        else:
            console.print(
                Text(format_event(event), style=STATUS_STYLE.get(str(event.data.get("status")), "")), soft_wrap=True
            )
        if event.type == "JOB_FINISHED":
            final = str(event.data.get("status") or "")
    if final is None or final not in TERMINAL_STATUSES:
        final = str(client.get_job(args.job_id).status)
    return EXIT_OK if final in ENDED_WELL else EXIT_FAIL


# ---------------------------------------------------------------------- results


@client_command
def cmd_results(args: argparse.Namespace, client: HitlClient) -> int:
    if args.wait:
        try:
            client.wait_for(args.job_id, timeout=args.timeout)
        except WaitTimeout as exc:
            report_error(args, config_of(args), exc)
            return EXIT_FAIL
    try:
        res = client.results(args.job_id)
    except ApiError as exc:
        if exc.code == "JOB_NOT_FINISHED" and not args.json:
            status = exc.snapshot.get("status") if exc.snapshot else "not finished"
            error_console().print(f"job {args.job_id} is {status}; results exist once it ends (add --wait to wait)")
            return EXIT_FAIL
        raise
    written = download_outputs(client, res, args.out) if args.out else []
    if args.json:
        print_json({**res.model_dump(mode="json"), "files": [str(p) for p in written]})
    else:
        print_results(res, Console(highlight=False))
        if args.out:
            Console(highlight=False).print(f"{len(written)} files written to {args.out}")
    return EXIT_OK


def print_results(res: JobResults, console: Console) -> None:
    title = f"{res.job_id}  {res.status}" + (f"  ({res.reason_code})" if res.reason_code else "")
    table = Table(title=title, title_justify="left")
    for col in ("box", "label", "status", "tries", "bbox", "reason", "quality", "mask", "cut-out"):
        table.add_column(col, overflow="fold")
    for s in res.subjects:
        table.add_row(
            s.box_id,
            s.label or "-",
            styled(s.status),
            str(s.attempts) if s.attempts else "-",  # starts of its SEGMENT_SUBJECT nodes (a retry counts)
            "[" + ", ".join(f"{x:g}" for x in s.bbox) + "]",
            s.reason or "",
            quality_cell(s),
            s.mask_url or "-",
            s.cutout_url or "-",
        )
    console.print(table)


def quality_cell(s: SubjectResult) -> Text:
    """The gate's word on a subject's mask: ``PASS`` (by whom), or ``FAIL`` with its reasons, and the
    refinements tried before it; ``-`` when no gate judged it."""
    if s.quality is None:
        return Text("-")
    q = s.quality
    out = Text(q.verdict, style="green" if q.verdict == "PASS" else "bold red")
    if s.refinements:
        out.append(f" after {len(s.refinements)} refinement(s): " + ", ".join(r.strategy for r in s.refinements))
    if s.decided_by:
        out.append(f" ({q.policy}, decided by {s.decided_by})")
    else:
        out.append(f" ({q.policy})")
    for reason in q.reasons:
        out.append(f"\n- {reason}")
    if q.scores:  # the gate's measurements, as recorded (docs/protocol.md § Cut-out quality)
        out.append("\n" + " · ".join(f"{k} {v:.2f}" for k, v in sorted(q.scores.items())), style="dim")
    return out


# ---------------------------------------------------------------------- jobs


@client_command
def cmd_jobs(args: argparse.Namespace, client: HitlClient) -> int:
    if getattr(args, "flagged", False):
        page = client.flagged_jobs(args.limit)
    else:
        page = client.list_jobs(args.status, args.limit, args.cursor)
    if args.json:
        print_json(page.model_dump(mode="json"))
        return EXIT_OK
    table = Table()
    table.add_column("job", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for col in ("version", "created", "stage", "waiting", "boxes", "submitter", "flag"):
        table.add_column(col)
    for j in page.jobs:
        table.add_row(
            j.job_id,
            styled(str(j.status)),
            str(j.version),
            j.created_at,
            j.stage or "",
            age_text(j.pause_created_at) if j.pause_created_at else "",
            str(j.box_count),
            j.submitter,
            f"{j.flag.by}: {j.flag.reason}" if j.flag else "",
        )
    console = Console(highlight=False)
    console.print(table)
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")
    return EXIT_OK
