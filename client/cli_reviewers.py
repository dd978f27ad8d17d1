"""``hitl admin reviewers add|remove|list``: reviewer accounts, in force on every API replica
without a restart (docs/protocol.md § Reviewer accounts). They need an admin token."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from .api import HitlClient
from .cli_common import EXIT_OK, client_command, error_console, print_json

ROLES = ("reviewer", "submitter", "admin")
Command = Callable[..., argparse.ArgumentParser]  # client.commands._command


@client_command
def cmd_add(args: argparse.Namespace, client: HitlClient) -> int:
    added = client.add_reviewer(args.name, args.role)
    if args.json:
        print_json(added)
        return EXIT_OK
    # The token alone on stdout (TOKEN=$(hitl admin reviewers add NAME) keeps it); the words on stderr.
    error_console().print(
        f"added {added['name']} ({added['role']}); its token, shown this once (only its hash is kept):", markup=False
    )
    print(added["token"], flush=True)
    return EXIT_OK


@client_command
def cmd_remove(args: argparse.Namespace, client: HitlClient) -> int:
    removed = client.remove_reviewer(args.name)["removed"]
    if args.json:
        print_json(removed)
        return EXIT_OK
    Console(highlight=False).print(
        f"removed {removed['name']} ({removed['role']}): its token is refused within seconds", markup=False
    )
    return EXIT_OK


@client_command
def cmd_list(args: argparse.Namespace, client: HitlClient) -> int:
    found: dict[str, Any] = client.reviewers()
    if args.json:
        print_json(found)
        return EXIT_OK
    console = Console(highlight=False)
    table = Table("name", "role", "added", "by", "from")
    for a in found["accounts"]:
        table.add_row(a["name"], a["role"], a["added_at"], a["added_by"], "account")
    for s in found["static"]:
        table.add_row(s["name"], s["role"], "-", "-", "HITL_TOKENS")
    console.print(table)
    return EXIT_OK


def add_reviewer_commands(admin_sub: Any, command: Command, formatter: type[argparse.HelpFormatter]) -> None:
    """``reviewers`` and its three subcommands on ``hitl admin``'s subparsers."""
    group = admin_sub.add_parser(
        "reviewers",
        formatter_class=formatter,
        help="add, remove and list reviewer accounts (no restart)",
        description="Reviewer accounts live in Redis: one added here can sign in at once, on every API replica; "
        "one removed is refused within a few seconds. Redis keeps a token's SHA-256, never the token: `add` shows "
        "it once. Each change is logged with the admin who made it. Identities in HITL_TOKENS are listed but "
        "changed only there (and a restart).",
    )
    sub = group.add_subparsers(dest="reviewers_command", metavar="REVIEWERS_COMMAND", required=True)
    p = command(
        sub,
        "add",
        cmd_add,
        help="add an account and print its token (once)",
        description="Add an account and print its new token on stdout (the rest on stderr), e.g. "
        "TOKEN=$(hitl admin reviewers add alice). The name must be free (409 NAME_TAKEN): remove the account "
        "first to give it a new token.",
    )
    p.add_argument("name", metavar="NAME", help="the reviewer's name (letters, digits, _ . @ + -; up to 64)")
    p.add_argument("--role", choices=ROLES, default="reviewer", help="the account's role (default reviewer)")
    p = command(
        sub,
        "remove",
        cmd_remove,
        help="remove an account: its token stops working",
        description="Remove an account; every API replica refuses its token within a few seconds (401).",
    )
    p.add_argument("name", metavar="NAME", help="the account's name")
    command(
        sub,
        "list",
        cmd_list,
        help="list the accounts (and the HITL_TOKENS identities)",
        description="List the accounts (name, role, when and by whom added) and the identities HITL_TOKENS "
        "configures. Tokens are never shown again.",
    )
