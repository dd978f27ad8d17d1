"""The options that say how ``hitl export`` reports (``--json``) and when it fails
(``--allow-missing``); standard library only, beside ``archive.options``: ``archive.cli`` puts them on
``hitl``'s parser, ``archive.export.main`` on its own."""

from __future__ import annotations

import argparse


def add_output_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """What ``hitl export`` says and when it fails: ``--json``, ``--allow-missing``."""
    p.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object on stdout: the summary (images, annotations, masks, labels, missing), or {"error": '
        "{code, message}} beside it when the export failed",
    )
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="exit 0 although the artifact store lacked masks or images (the set is written without them); "
        "by default that is exit status 1",
    )
    p.epilog = (
        "The data directory is --data-dir, else $HITL_DATA_DIR, else .hitl; the artifact store --artifacts, else "
        "$HITL_ARTIFACTS, else <data-dir>/artifacts. Exit status 1: no archive, or masks or images missing."
    )
    return p
