"""Where the server is and which token to send (docs/protocol.md § Identity for the token itself).

URL: ``--api-url``, else ``HITL_API_URL``, else ``http://127.0.0.1:8000``.
Token: ``--token``, else ``HITL_TOKEN``, else the local admin token that a
loopback server writes to ``<data-dir>/api-token``; the data directory is
``--data-dir``, else ``HITL_DATA_DIR``, else ``.hitl``. Empty values count as unset.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DEFAULT_API_URL = "http://127.0.0.1:8000"
DEFAULT_DATA_DIR = ".hitl"
TOKEN_FILE = "api-token"


@dataclass(frozen=True)
class ClientConfig:
    api_url: str
    token: str | None
    data_dir: Path
    # "--token", "HITL_TOKEN", the token file's path, or None: shown when the server answers 401.
    token_source: str | None = None


def _pick(*values: str | os.PathLike[str] | None) -> str | None:
    for v in values:
        if v is not None and str(v).strip():
            return str(v).strip()
    return None


def read_token_file(path: Path) -> str | None:
    """The token in ``path`` (first non-empty line), or None when the file is missing, unreadable or empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return None


def resolve_config(
    api_url: str | None = None,
    token: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> ClientConfig:
    env = os.environ if env is None else env
    url = _pick(api_url, env.get("HITL_API_URL")) or DEFAULT_API_URL
    ddir = Path(_pick(data_dir, env.get("HITL_DATA_DIR")) or DEFAULT_DATA_DIR).expanduser()
    if _pick(token):
        return ClientConfig(url, _pick(token), ddir, "--token")
    if _pick(env.get("HITL_TOKEN")):
        return ClientConfig(url, _pick(env.get("HITL_TOKEN")), ddir, "HITL_TOKEN")
    token_path = ddir / TOKEN_FILE
    file_token = read_token_file(token_path)
    return ClientConfig(url, file_token, ddir, str(token_path) if file_token else None)


@cache
def tls_context() -> ssl.SSLContext:
    """One TLS context (the system's CA certificates) for every client of this process: httpx builds a new
    one per client otherwise, ~10 ms of CPU each, and the reviewer UI opens a client per page action."""
    return ssl.create_default_context()
