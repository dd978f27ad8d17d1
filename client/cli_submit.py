"""``hitl submit``: many files through ``client.batch.run_batch``, and the summary it prints."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from .api import HitlClient
from .batch import CATEGORIES, BatchSummary, check_batch_name, run_batch
from .cli_common import EXIT_FAIL, EXIT_INTERRUPTED, config_of, error_console, print_json, styled
from .prelabels import BoxSource, LabelError, read_classes


def cmd_submit(args: argparse.Namespace) -> int:
    cfg = config_of(args)
    if args.manifest:
        manifest = args.manifest
    elif args.out:
        manifest = args.out / "manifest.jsonl"
    else:
        manifest = cfg.data_dir / "batches" / f"{args.batch}.jsonl"
    err = error_console()
    try:
        check_batch_name(args.batch)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return EXIT_FAIL
    try:
        boxes = BoxSource(args.boxes, read_classes(args.classes) if args.classes else None) if args.boxes else None
    except LabelError as exc:
        err.print(f"[red]error:[/red] --boxes: {exc}")
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
                review_quorum=args.quorum,
                quorum_policy=args.quorum_policy,
                boxes=boxes,
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
        print_json(summary.to_dict())
    else:
        print_submit_summary(summary, err)
    return summary.exit_code


def print_submit_summary(summary: BatchSummary, err: Console) -> None:
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
            table.add_row(str(f.path), f.job_id or "-", styled(f.final_status or f.status or None), "; ".join(notes))
        out.print(table)
    counts = summary.counts()
    line = ", ".join(f"{counts[c]} {c}" for c in CATEGORIES if c in counts) or "no images"
    if summary.skipped:
        line += f", {len(summary.skipped)} skipped"
    out.print(line)
    if summary.manifest and summary.manifest.exists():  # nothing submitted: no manifest was written
        out.print(f"manifest: {summary.manifest}")
    if summary.aborted:
        err.print(f"[red]stopped early:[/red] {summary.aborted}")
    if summary.interrupted:
        err.print("[yellow]interrupted[/yellow]: run the same command again to resume")
