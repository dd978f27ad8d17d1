"""``hitl flag`` and ``hitl comment``: what a reviewer notes on a job without deciding it
(docs/protocol.md § Flags, skips and comments). ``hitl jobs --flagged`` lists a lead's flagged jobs."""

from __future__ import annotations

import argparse

from .api import HitlClient
from .cli_common import EXIT_OK, client_command, print_json


@client_command
def cmd_flag(args: argparse.Namespace, client: HitlClient) -> int:
    if args.remove:
        removed = client.unflag(args.job_id)
        if args.json:
            print_json({"removed": removed})
        else:
            print(f"{args.job_id}: flag removed" if removed else f"{args.job_id}: had no flag")
        return EXIT_OK
    flagged = client.flag(args.job_id, args.reason)
    if args.json:
        print_json(flagged.model_dump(mode="json"))
    else:
        print(f"{args.job_id}: flagged for a lead by {flagged.by}: {flagged.reason}")
    return EXIT_OK


@client_command
def cmd_comment(args: argparse.Namespace, client: HitlClient) -> int:
    posted = client.comment(args.job_id, args.text)
    if args.json:
        print_json(posted.model_dump(mode="json"))
    else:
        print(f"{args.job_id}: comment by {posted.by} at {posted.at}")
    return EXIT_OK
