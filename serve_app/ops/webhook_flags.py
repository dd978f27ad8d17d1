"""``hitl up``'s webhook flags (docs/protocol.md § Webhooks), and the secret their file names. Light:
``hitl``'s parser imports it (the server's modules only when ``up`` runs)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_webhook_options(p: argparse.ArgumentParser) -> None:
    w = p.add_argument_group("webhooks (docs/protocol.md § Webhooks)")
    w.add_argument(
        "--webhook",
        action="append",
        default=None,
        metavar="[TYPES=]URL",
        help="POST each event to URL, signed (X-Hitl-Signature: t=…,v1=HMAC-SHA256), retried until it answers "
        "2xx: TYPES is a comma list of review.waiting, job.finished, policy.shadow (all when left out), "
        "e.g. --webhook job.finished=https://ci.example/hook; repeat for several",
    )
    w.add_argument(
        "--webhook-secret-file",
        default=None,
        metavar="FILE",
        help="the webhooks' signing secret, read from FILE (else $HITL_WEBHOOK_SECRET); required with --webhook",
    )
    w.add_argument(
        "--webhook-timeout-s",
        type=float,
        default=None,
        metavar="S",
        help="a delivery attempt that has no answer within S seconds failed and is retried (default 10)",
    )
    w.add_argument(
        "--webhook-give-up-after-s",
        type=float,
        default=None,
        metavar="S",
        help="a delivery still failing S seconds after its first attempt is given up, logged and counted "
        "(default 86400)",
    )


def webhook_secret(path: str | None) -> str | None:
    """The secret in ``--webhook-secret-file`` (its text, stripped); None without the flag (the
    environment's HITL_WEBHOOK_SECRET then). Never echoed: a bad file is named, not its content."""
    from .preflight import UpError

    if not path:
        return None
    try:
        secret = Path(path).read_text().strip()
    except OSError as e:
        raise UpError(f"--webhook-secret-file {path}: cannot be read ({e.strerror or e})") from None
    if not secret:
        raise UpError(f"--webhook-secret-file {path}: the file is empty")
    return secret
