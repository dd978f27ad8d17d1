"""What the client commands share: exit statuses, status colours, JSON and error output, the
connection configuration, and ``client_command``, which opens a client for a command and turns
client errors into a message and exit status 1."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

from rich.console import Console
from rich.text import Text

from .api import HitlClient
from .config import ClientConfig, resolve_config
from .errors import ApiError, AuthError, ConnectionFailed, HitlClientError
from .times import age_seconds

Handler = Callable[[argparse.Namespace], int]

EXIT_OK, EXIT_FAIL, EXIT_INTERRUPTED = 0, 1, 130
STATUS_STYLE = {
    "SUCCEEDED": "green",
    "PARTIAL_SUCCEEDED": "green",
    "EMPTY_SELECTION": "cyan",
    "FAILED": "red",
    "TIMED_OUT": "red",
    "CANCELLED": "yellow",
    "WAITING_USER_SELECTION": "magenta",
    "WAITING_BOX_BATCH_REVISION": "magenta",
    "WAITING_MASK_REVIEW": "magenta",
}


def error_console() -> Console:
    """stderr; off a terminal (a log, a pipe) a message stays one line: rich would wrap it at 80 columns."""
    return Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def config_of(args: argparse.Namespace) -> ClientConfig:
    return resolve_config(args.api_url, args.token, args.data_dir)


def styled(status: str | None) -> Text:
    return Text(status or "-", style=STATUS_STYLE.get(status or "", ""))


def client_command(fn: Callable[[argparse.Namespace, HitlClient], int]) -> Handler:
    """Open a client for the command and turn client errors into a message and exit status 1."""

    @wraps(fn)
    def run(args: argparse.Namespace) -> int:
        cfg = config_of(args)
        try:
            with HitlClient.from_config(cfg) as client:
                return fn(args, client)
        except KeyboardInterrupt:
            error_console().print("interrupted")
            return EXIT_INTERRUPTED
        except HitlClientError as exc:
            report_error(args, cfg, exc)
            return EXIT_FAIL

    return run


def report_error(args: argparse.Namespace, cfg: ClientConfig, exc: HitlClientError) -> None:
    hint = ""
    if isinstance(exc, AuthError) and exc.status_code == 401:
        hint = (
            f"token from {cfg.token_source}"
            if cfg.token_source
            else "no token found: pass --token, set HITL_TOKEN, or point --data-dir at the server's data dir"
        )
    elif isinstance(exc, ConnectionFailed):
        hint = f"is the server running at {cfg.api_url}? (--api-url / HITL_API_URL)"
    if args.json:
        err: dict[str, Any] = {"message": str(exc)}
        if isinstance(exc, ApiError):
            err.update(status_code=exc.status_code, code=exc.code, message=exc.message, snapshot=exc.snapshot)
        if hint:
            err["hint"] = hint
        print_json({"error": err})
        return
    console = error_console()
    console.print(f"[red]error:[/red] {exc}", markup=True)
    if isinstance(exc, ApiError) and exc.snapshot:
        console.print(f"the job is now {exc.snapshot.get('status')} (version {exc.snapshot.get('version')})")
    if hint:
        console.print(hint)


def age_text(iso: str | None) -> str:
    seconds = age_seconds(iso)
    if seconds is None:
        return "-"
    secs = int(seconds)
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h{(secs % 3600) // 60:02d}m"
    return f"{secs // 86400}d"
