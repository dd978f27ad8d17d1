"""``HitlClient``'s identity and reviewer-account calls (docs/protocol.md § Identity, § Reviewer
accounts): who the server takes the client for, and the admin's accounts (``hitl admin reviewers``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .core import ClientCore
from .steps import Plan


class AccountCalls:
    """A base of ``HitlClient``, which provides ``_core`` and ``_run``."""

    _core: ClientCore
    _run: Callable[[Plan[dict[str, Any]]], dict[str, Any]]

    def whoami(self) -> dict[str, Any]:
        """``{"name", "role"}``: who the server takes this client for."""
        return self._run(self._core.whoami())

    def reviewers(self) -> dict[str, Any]:
        """The reviewer accounts and the HITL_TOKENS identities (admin token)."""
        return self._run(self._core.reviewers())

    def add_reviewer(self, name: str, role: str = "reviewer") -> dict[str, Any]:
        """Add a reviewer account (admin token); the answer's ``token`` is shown this once."""
        return self._run(self._core.add_reviewer(name, role))

    def remove_reviewer(self, name: str) -> dict[str, Any]:
        """Remove a reviewer account (admin token): its token stops working at once here, within
        seconds on every other API replica."""
        return self._run(self._core.remove_reviewer(name))
