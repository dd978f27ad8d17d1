"""Real services or nothing: locally a missing one skips the test, under ``CI`` it fails the run."""

from __future__ import annotations

import os
from typing import NoReturn

from hitl_review.serve_app.ops.redis_server import find_binary

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(what: str) -> NoReturn:
    """Skip the test for want of ``what``; under CI fail it instead (``make setup`` provides everything)."""
    import pytest

    if IN_CI:
        pytest.fail(f"{what} is required under CI (make setup installs it)")
    pytest.skip(f"{what} not installed")


def require_binary(name: str) -> str:
    """The path of the executable ``name`` (PATH, then /usr/bin), or :func:`missing`."""
    path = find_binary(name)
    if path is None:
        missing(name)
    return path
