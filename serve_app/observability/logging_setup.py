"""How the control plane logs (README § Logs).

- ``setup_logging``: ``hitl up``'s own process, to stderr and ``<data-dir>/logs/hitl.log`` (rotated
  at ``MAX_BYTES``, ``BACKUPS`` kept);
- ``configure_component``: inside a Ray Serve replica (Api, Events, Archiver), the ``hitl`` loggers to
  the replica's stderr (Ray's worker log files), in the same format; Serve's own line per request is
  dropped there (``drop_serve_access_lines``): ``serve_app.observability.request_log`` writes one of its own;
- two formats (``--log-format``): ``json``, one object per line (``ts``, ``level``, ``logger``,
  ``msg``, then the record's extra fields: ``request_id``, ``job_id``, ``reviewer``, ``outcome``,
  ``latency_ms``, …), the default when stderr is not a terminal; ``text``, the readable line;
- ``REQUEST_ID``: the request being served (its ``X-Request-ID``), added to every record that a
  handler made here writes (``RequestIdFilter``);
- ``rotate_file``: size-capped rotation by renaming, for files another process appends to
  (redis.log, ui.log).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal, cast

REQUEST_ID: ContextVar[str | None] = ContextVar("hitl_request_id", default=None)
Format = Literal["json", "text"]
FORMATS = ("json", "text")
MAX_BYTES = 50 * 1024 * 1024  # hitl.log, redis.log and ui.log rotate at this size
BACKUPS = 5  # rotated files kept: hitl.log.1 … hitl.log.5
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every LogRecord has; anything else on a record came in through ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def resolve_format(fmt: str | None, stream: IO[Any] | None = None) -> Format:
    """``json`` or ``text``; ``None``/``auto``: text on a terminal, else json."""
    if fmt in (None, "auto"):
        stream = stream if stream is not None else sys.stderr
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            tty = False
        return "text" if tty else "json"
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: json or text")
    return cast(Format, fmt)


class RequestIdFilter(logging.Filter):
    """Puts the request being served on each record (``request_id``; None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ms), level, logger, msg, the extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in out and value is not None:
                out[key] = value if isinstance(value, str | int | float | bool) else _plain(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def _plain(value: Any) -> Any:
    """A JSON value as it is (lists, mappings of plain data), anything else as its text."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


class TextFormatter(logging.Formatter):
    """The readable line; within a request, ``[request_id=…]`` at its end."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        return f"{line} [request_id={rid}]" if rid else line


def formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if resolve_format(fmt) == "json" else TextFormatter()


def make_handler(handler: logging.Handler, fmt: str) -> logging.Handler:
    """``handler`` writing ``fmt`` (json or text) lines, each with the request id."""
    handler.setFormatter(formatter(fmt))
    handler.addFilter(RequestIdFilter())
    return handler


def setup_logging(
    data_dir: Path,
    verbose: bool = False,
    log_format: str | None = None,
    *,
    max_bytes: int = MAX_BYTES,
    backups: int = BACKUPS,
    stream: IO[str] | None = None,
) -> Format:
    """The launcher's logging: stderr (or ``stream``) and ``<data-dir>/logs/hitl.log``, rotated at
    ``max_bytes`` with ``backups`` kept, in ``log_format`` (resolved against stderr). The format used."""
    fmt = resolve_format(log_format)
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    handlers = [
        make_handler(logging.StreamHandler(stream if stream is not None else sys.stderr), fmt),
        make_handler(
            logging.handlers.RotatingFileHandler(
                data_dir / "logs" / "hitl.log", maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
            ),
            fmt,
        ),
    ]
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=handlers, force=True)
    # httpx logs each request at INFO: the launcher's own polls of /readyz and of the UI, a line each.
    logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)
    return fmt


_COMPONENT_HANDLER = "hitl-component"


def configure_component(log_format: str | None, level: int = logging.INFO) -> None:
    """In a Serve replica: the ``hitl`` loggers write ``log_format`` lines with the request id to the
    replica's stderr (Ray keeps it in the worker's log file), at ``level``; called again (a second
    replica in the process), nothing is added twice."""
    logger = logging.getLogger("hitl")
    for h in [h for h in logger.handlers if h.get_name() == _COMPONENT_HANDLER]:
        logger.removeHandler(h)
    handler = make_handler(logging.StreamHandler(sys.__stderr__ or sys.stderr), resolve_format(log_format))
    handler.set_name(_COMPONENT_HANDLER)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # Ray's own handlers on the root would write it a second time


def _not_serve_access_line(record: logging.LogRecord) -> bool:
    return not getattr(record, "serve_access_log", False)


def drop_serve_access_lines() -> None:
    """In the Api replica: Serve writes a line for every request (each queue poll among them); the
    app writes its own (``serve_app.observability.request_log``: writes and errors at INFO, reads at DEBUG), so
    Serve's goes. A filter on Serve's logger, which outlives Serve reconfiguring its handlers."""
    logger = logging.getLogger("ray.serve")
    if _not_serve_access_line not in logger.filters:
        logger.addFilter(_not_serve_access_line)


def rotate_file(path: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> bool:
    """Rename ``path`` to ``path.1`` (``.1`` to ``.2``, …, ``backups`` kept) once it holds at least
    ``max_bytes``; True if it did. For a file another process appends to by name: redis-server
    opens its logfile for each line, so it starts a new one; a child holding it open (the UI) goes
    on writing into ``.1`` until it is restarted."""
    try:
        if path.stat().st_size < max_bytes:
            return False
    except FileNotFoundError:
        return False
    for n in range(backups - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{n + 1}"))
    if backups > 0:
        os.replace(path, path.with_name(f"{path.name}.1"))
    else:
        path.unlink()
    return True
