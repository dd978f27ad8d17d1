"""The admin commands: ``hitl admin dead-letters``, ``hitl admin replay ID`` (docs/protocol.md §
Executors and the outbox) and ``hitl admin reconcile`` (§ Reconcile). They need an admin token."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from .api import HitlClient
from .cli_common import EXIT_OK, client_command, print_json


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
