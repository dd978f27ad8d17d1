"""``python -m hitl_review.ui --api-url URL --port PORT``: the reviewer UI on its own."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hitl_review.statecore.trusted_proxy import parse_networks

from .editor import LABELS_ENV, parse_labels
from .server import launch


def _token(args: argparse.Namespace) -> str | None:
    """--token, then HITL_TOKEN, then the local token file that ``hitl up`` writes into its data directory."""
    if args.token:
        return str(args.token)
    if os.environ.get("HITL_TOKEN"):
        return os.environ["HITL_TOKEN"]
    path = Path(args.data_dir or os.environ.get("HITL_DATA_DIR") or ".hitl") / "api-token"
    return path.read_text().strip() if path.is_file() else None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m hitl_review.ui", description="hitl-review reviewer UI (Gradio)")
    p.add_argument(
        "--api-url",
        default=os.environ.get("HITL_API_URL", "http://127.0.0.1:8000"),
        help="control plane URL (default HITL_API_URL or http://127.0.0.1:8000)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    p.add_argument(
        "--token", default=None, help="API token used for every browser (default HITL_TOKEN or <data-dir>/api-token)"
    )
    p.add_argument("--data-dir", default=None, help="where `hitl up` keeps the local token (default .hitl)")
    p.add_argument("--require-login", action="store_true", help="each reviewer signs in with their own token")
    p.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="CIDR",
        help="an authenticating proxy's address or block: the user it names (X-Forwarded-User, …) is signed in "
        "and passed on to the API, which must trust this UI's address too (repeatable; default none)",
    )
    p.add_argument(
        "--labels",
        default=os.environ.get(LABELS_ENV),
        help=f"the label set, comma-separated (e.g. shoe,bag,shirt); keys 1-9 pick the first 9 (default {LABELS_ENV})",
    )
    args = p.parse_args(argv)
    try:
        labels = parse_labels(args.labels)
    except ValueError as e:
        p.error(f"--labels: {e}")
    try:
        parse_networks(args.trusted_proxy)
    except ValueError as e:
        p.error(str(e))
    token = None if args.require_login else _token(args)
    launch(args.api_url, args.host, args.port, token, args.require_login, labels, tuple(args.trusted_proxy))


if __name__ == "__main__":
    main()
