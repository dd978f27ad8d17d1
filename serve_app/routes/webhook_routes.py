"""``GET /api/v1/admin/webhooks/log`` (admin; ``hitl admin webhooks``): the webhooks' newest delivery
attempts and how many deliveries wait (docs/protocol.md § Webhooks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query

from hitl_review.statecore import webhooks

if TYPE_CHECKING:
    from hitl_review.statecore.store import Store

API = "/api/v1"


def add_webhook_routes(app: FastAPI, store_of: Callable[[], Store]) -> None:
    @app.get(f"{API}/admin/webhooks/log")
    async def webhook_log(limit: int = Query(default=100, ge=1, le=1000)) -> dict[str, Any]:
        """The newest delivery attempts, newest first, and the deliveries queued or being retried."""
        r = store_of().r
        return {"pending": await webhooks.pending(r), "attempts": await webhooks.read_log(r, limit)}
