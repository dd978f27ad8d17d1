"""``hitl up``'s flags for what the API answers without a token (docs/scaling.md § Monitoring)."""

from __future__ import annotations

import argparse


def add_public_options(g: argparse._ArgumentGroup) -> None:
    """--public-metrics and --public-docs (Settings.public_metrics, public_docs): None, the default, opens
    them only on a loopback --host, where anyone who connects can read <data-dir>/api-token anyway."""
    g.add_argument(
        "--public-metrics",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="/metrics without a token (default: only when --host is loopback; elsewhere Prometheus sends a "
        "token of role monitor, which reads /metrics and nothing else)",
    )
    g.add_argument(
        "--public-docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the API's /docs, /redoc and /openapi.json without a token (default: only when --host is loopback)",
    )
