"""The admin commands: ``hitl admin dead-letters``, ``hitl admin replay ID`` (docs/protocol.md §
Executors and the outbox), ``hitl admin reconcile`` (§ Reconcile), ``hitl admin verify-audit``
(§ Audit) and ``hitl admin gc-artifacts`` (docs/archive.md § Artifact retention). They need an admin token."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from .api import HitlClient
from .cli_common import EXIT_FAIL, EXIT_OK, client_command, print_json


@client_command
def cmd_dead_letters(args: argparse.Namespace, client: HitlClient) -> int:
    letters = client.dead_letters()
    if args.json:
        print_json([d.model_dump(mode="json") for d in letters])
        return EXIT_OK
    console = Console(highlight=False)
    if not letters:
        console.print("no dead letters")
        return EXIT_OK
    table = Table("id", "job", "kind", "at", "reason")
    for d in letters:
        table.add_row(d.id, d.job_id, d.kind, d.at, d.reason)
    console.print(table)
    return EXIT_OK


@client_command
def cmd_webhooks(args: argparse.Namespace, client: HitlClient) -> int:
    """``hitl admin webhooks``: the newest delivery attempts (docs/protocol.md § Webhooks)."""
    log = client.webhook_log(args.limit)
    if args.json:
        print_json(log)
        return EXIT_OK
    print(f"{log['pending']} deliveries pending")
    for a in log["attempts"]:  # one line each (a table of eight columns wraps on a terminal)
        why = a.get("error") or a.get("status") or ""
        what = f"{a.get('type')} {a.get('event_id')} #{a.get('attempt')}"
        print(f"{a.get('at')} {a.get('outcome', ''):9} {what} {a.get('url')} {why}")
    return EXIT_OK


@client_command
def cmd_replay(args: argparse.Namespace, client: HitlClient) -> int:
    done = client.replay_dead_letter(args.dead_letter_id)
    if args.json:
        print_json(done.model_dump(mode="json"))
    else:
        Console(highlight=False).print(f"{done.id} ({done.kind} of {done.job_id}): {done.result}")
    return EXIT_OK


@client_command
def cmd_reconcile(args: argparse.Namespace, client: HitlClient) -> int:
    done = client.reconcile()
    if args.json:
        print_json(done)
        return EXIT_OK
    console = Console(highlight=False)
    counts = done.get("counts") or {}
    console.print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "the live mirror is empty")
    restored = [j for j in done.get("jobs", []) if j["outcome"] == "RESTORED"]
    if restored:
        table = Table("job", "status", "from version")
        for j in restored:
            table.add_row(j["job_id"], j["status"], str(j["version"]))
        console.print(table)
    return EXIT_OK


@client_command
def cmd_verify_audit(args: argparse.Namespace, client: HitlClient) -> int:
    if not args.all and not args.job_ids:
        raise SystemExit("hitl admin verify-audit: name jobs (JOB …) or give --all")
    done = client.verify_audit(args.job_ids, everything=args.all)
    broken = done["broken"]
    if args.json:
        print_json(done)
        return EXIT_FAIL if broken else EXIT_OK
    console = Console(highlight=False)
    for b in broken:
        seq = f" (seq {b['seq']})" if b.get("seq") is not None else ""
        line = f"BROKEN {b['job_id']} [{b['source']}]: entry {b['position']}{seq}: {b['reason']}"
        console.print(line, markup=False, soft_wrap=True)
    verdict = f"{len(broken)} broken" if broken else "every chain verifies"
    console.print(f"{done['checked']} job(s), {done['copies']} chain(s) checked (Redis and archive): {verdict}")
    return EXIT_FAIL if broken else EXIT_OK


@client_command
def cmd_gc_artifacts(args: argparse.Namespace, client: HitlClient) -> int:
    done = client.artifact_gc(args.older_than_days, dry_run=args.dry_run)
    if args.json:
        print_json(done)
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    Console(highlight=False).print(
        f"{done['jobs']} archived job(s) finished over {args.older_than_days:g} days ago, "
        f"{done['candidates']} blob(s): "
        f"{verb} {done['deleted']}; kept {done['shared']} another job uses, {done['recent']} written within the "
        f"last hour; {done['missing']} already gone",
        markup=False,
    )
    return EXIT_OK
