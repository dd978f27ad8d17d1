"""The archive's commands for ``hitl`` (docs/archive.md § Export, § Migrations): ``hitl export`` and
``hitl admin archive-upgrade``. Only the standard library is imported here, so ``hitl`` builds its
parser from the client's base install; SQLAlchemy, pycocotools and the rest are imported when a
command runs, and a missing extra is explained rather than raised."""

from __future__ import annotations

import argparse
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
