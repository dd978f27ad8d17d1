"""The archive's commands for ``hitl`` (docs/archive.md § Export, § Migrations): ``hitl export`` and
``hitl admin archive-upgrade``. Only the standard library is imported here, so ``hitl`` builds its
parser from the client's base install; SQLAlchemy, pycocotools and the rest are imported when a
command runs, and a missing extra is explained rather than raised."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

EXTRA_HINT = "`hitl {command}` needs the archive's packages: pip install 'hitl-review[{extra}]' (missing: {name})"
EXPORT_DESCRIPTION = (
    "Write the reviewer-approved boxes, labels and masks of archived jobs as a training set: COCO "
    "(annotations.json, masks as RLE) or YOLO (labels/*.txt, masks/*.png, data.yaml), the images "
    "beside them, and the reviewer's corrections to the detector's proposals (added, moved, "
    "relabelled, deleted boxes) apart in corrections.json."
)


def parse_since(text: str) -> datetime:
    """A date (midnight UTC) or an ISO date-time (UTC unless it says otherwise)."""
    try:
        d = date.fromisoformat(text)
        return datetime(d.year, d.month, d.day, tzinfo=UTC)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a date or date-time: {text!r}") from e
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _add_location(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None, metavar="DIR", help="data directory (default .hitl)")
    p.add_argument(
        "--archive-url",
        default=None,
        metavar="URL",
        help="the archive (default HITL_ARCHIVE_URL, else <data-dir>/archive.sqlite3)",
    )


def add_export_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--format", required=True, choices=("coco", "yolo"), help="COCO (RLE masks) or YOLO")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory to write (created)")
    p.add_argument("--since", type=parse_since, metavar="DATE", help="only jobs finished at or after DATE (UTC)")
    p.add_argument("--batch", metavar="NAME", help="only the jobs of `hitl submit --batch NAME`")
    _add_location(p)
    p.add_argument("--artifacts", default=None, metavar="ROOT", help="artifact store (default <data-dir>/artifacts)")
    p.set_defaults(func=run_export)
    return p


def add_upgrade_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    _add_location(p)
    p.add_argument("--check", action="store_true", help="report the schema version, change nothing (1: behind)")
    p.set_defaults(func=run_upgrade)
    return p


def add_export_command(sub: Any, **kw: Any) -> argparse.ArgumentParser:
    """``hitl export`` on ``hitl``'s subparsers (``kw``: e.g. its ``formatter_class``)."""
    p = sub.add_parser("export", help="archived jobs' approved boxes and masks as COCO or YOLO", **kw)
    p.description = EXPORT_DESCRIPTION
    return add_export_arguments(p)


def add_upgrade_command(admin_sub: Any, **kw: Any) -> argparse.ArgumentParser:
    """``hitl admin archive-upgrade`` on the subparsers of ``hitl admin``."""
    p = admin_sub.add_parser("archive-upgrade", help="migrate the archive to this build's schema", **kw)
    p.description = "Bring the archive (SQLite or PostgreSQL) to this build's schema with its Alembic revisions."
    return add_upgrade_arguments(p)


def _needs_extra(command: str, extra: str, run: Callable[[], int]) -> int:
    try:
        return run()
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top in {"archive", "statecore", "serve_app", "client"}:
            raise
        print(EXTRA_HINT.format(command=command, extra=extra, name=exc.name), file=sys.stderr)
        return 2


def run_export(args: argparse.Namespace) -> int:
    def run() -> int:
        from .export import run as export_run

        return export_run(args)

    return _needs_extra("export", "export", run)


def run_upgrade(args: argparse.Namespace) -> int:
    def run() -> int:
        from . import migrate

        return migrate.run(args)

    return _needs_extra("admin archive-upgrade", "server", run)


def export_main(argv: Sequence[str] | None = None) -> int:
    args = add_export_arguments(argparse.ArgumentParser(prog="hitl export", description=EXPORT_DESCRIPTION))
    parsed = args.parse_args(argv)
    return int(parsed.func(parsed))


def upgrade_main(argv: Sequence[str] | None = None) -> int:
    p = add_upgrade_arguments(argparse.ArgumentParser(prog="hitl admin archive-upgrade"))
    parsed = p.parse_args(argv)
    return int(parsed.func(parsed))
