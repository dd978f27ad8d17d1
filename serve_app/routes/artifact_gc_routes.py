"""``POST /api/v1/admin/artifacts/gc`` (admin; ``hitl admin gc-artifacts``): delete the blobs of
archived jobs past an age that no other job refers to (docs/archive.md § Artifact retention)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request

from hitl_review.statecore import errors
from hitl_review.statecore.artifacts import ArtifactStore

if TYPE_CHECKING:
    from hitl_review.archive.db import Archive
    from hitl_review.statecore.store import Store

log = logging.getLogger("hitl.api")

API = "/api/v1"


def add_artifact_gc_route(
    app: FastAPI,
    store_of: Callable[[], Store],
    archive_of: Callable[[], Archive | None],
    artifacts_of: Callable[[], ArtifactStore],
    who: Callable[[Request], str],
) -> None:
    @app.post(f"{API}/admin/artifacts/gc", responses={400: {}})
    async def artifact_gc(
        request: Request,
        older_than_days: float = Query(gt=0, le=36500),
        dry_run: bool = Query(default=False),
    ) -> dict[str, Any]:
        """Delete (``dry_run``: list) the blobs only archived jobs that finished more than
        ``older_than_days`` ago refer to; never one a job Redis holds or a newer archived job uses."""
        archive = archive_of()
        if archive is None:
            raise errors.InvalidRequest("archiving is off (--no-archive): only archived jobs' artifacts are collected")
        from hitl_review.archive.gc import collect

        done = await collect(store_of(), archive, artifacts_of(), older_than_days, dry_run=dry_run)
        log.warning("artifact gc by %s: %d deleted%s", who(request), len(done.deleted), " (dry run)" if dry_run else "")
        return done.as_dict()
