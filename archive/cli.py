"""The archive's commands for ``hitl`` (docs/archive.md § Export, § Migrations): ``hitl export`` and
``hitl admin archive-upgrade``. Only the standard library is imported here, so ``hitl`` builds its
parser from the client's base install; SQLAlchemy, pycocotools and the rest are imported when a
command runs, and a missing extra is explained rather than raised."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from typing import Any

from .export_flags import add_output_arguments
from .options import EXPORT_DESCRIPTION, add_export_arguments, add_upgrade_arguments

EXTRA_HINT = "`hitl {command}` needs the archive's packages: pip install 'hitl-review[{extra}]' (missing: {name})"


def add_export_command(sub: Any, **kw: Any) -> argparse.ArgumentParser:
    """``hitl export`` on ``hitl``'s subparsers (``kw``: e.g. its ``formatter_class``)."""
    p = sub.add_parser("export", help="archived jobs' approved boxes and masks as COCO or YOLO", **kw)
    p.description = EXPORT_DESCRIPTION
    add_output_arguments(add_export_arguments(p)).set_defaults(func=run_export)
    return p


def add_upgrade_command(admin_sub: Any, **kw: Any) -> argparse.ArgumentParser:
    """``hitl admin archive-upgrade`` on the subparsers of ``hitl admin``."""
    p = admin_sub.add_parser("archive-upgrade", help="migrate the archive to this build's schema", **kw)
    p.description = "Bring the archive (SQLite or PostgreSQL) to this build's schema with its Alembic revisions."
    add_upgrade_arguments(p).set_defaults(func=run_upgrade)
    return p


def _needs_extra(command: str, extra: str, run: Callable[[], int]) -> int:
    try:
        return run()
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "hitl_review":  # our own: a broken install, not an extra
            raise
        print(EXTRA_HINT.format(command=command, extra=extra, name=exc.name), file=sys.stderr)
        return 2


def _shown(url: str) -> str:
    """``url`` without its password (what may be printed)."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def unreachable(command: str, args: argparse.Namespace, exc: Exception) -> int:
    """The database did not answer (or refused the URL): one line on stderr, exit 1, and under
    ``--json`` the error as JSON on stdout, never a traceback."""
    from .db import archive_url

    cause = getattr(exc, "orig", None) or exc
    why = next((line.strip() for line in str(cause).splitlines() if line.strip()), type(cause).__name__)
    url = _shown(archive_url(args.data_dir, args.archive_url))
    message = (
        f"cannot reach the archive at {url}: {why.rstrip('.')}; check that the database runs and the URL "
        "(--archive-url, HITL_ARCHIVE_URL)"
    )
    print(f"hitl {command}: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": {"code": "ARCHIVE_UNREACHABLE", "message": message}}))
    return 1


def run_export(args: argparse.Namespace) -> int:
    def run() -> int:
        from sqlalchemy.exc import SQLAlchemyError

        from .export import run as export_run

        try:
            return export_run(args)
        except SQLAlchemyError as exc:
            return unreachable("export", args, exc)

    return _needs_extra("export", "export", run)


def run_upgrade(args: argparse.Namespace) -> int:
    def run() -> int:
        from sqlalchemy.exc import SQLAlchemyError

        from . import migrate

        try:
            return migrate.run(args)
        except SQLAlchemyError as exc:
            return unreachable("admin archive-upgrade", args, exc)

    return _needs_extra("admin archive-upgrade", "server", run)
