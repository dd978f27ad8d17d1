"""The store every part of the control plane builds from the deployment's settings: the API
replicas, plain uvicorn, the Archiver, a standalone dispatcher (``hitl dispatcher``). One function,
so none of them runs with another retention, archive flag, node timeout or attempt count than the
deployment's (a store built with defaults started finished jobs' retention without an archive copy)."""

from __future__ import annotations

from hitl_review.statecore import autoapprove
from hitl_review.statecore.auto_store import AutoApproveConfig
from hitl_review.statecore.store import Store, StoreConfig

from ..ops.config import Settings


def auto_approve_of(settings: Settings) -> AutoApproveConfig | None:
    """The box policy the store decides with (``--auto-approve``), loaded and verified from the text
    ``hitl up`` read (statecore.autoapprove.load refuses what preflight already refused)."""
    if settings.auto_approve == "off" or not settings.auto_approve_policy_text:
        return None
    policy = autoapprove.load(settings.auto_approve_policy_text, settings.auto_approve)
    return AutoApproveConfig(policy=policy, mode=settings.auto_approve, spot_check=settings.spot_check)


def store_for(settings: Settings, redis_url: str, *, blocking_s: float = 0.0) -> Store:
    """The store with the settings' operation timeout; ``blocking_s`` more for a store whose
    commands block on purpose (the dispatchers' XREADGROUP BLOCK), so waiting is not a timeout."""
    return Store.from_url(
        redis_url,
        StoreConfig(
            retention_s=settings.retention_s,
            node_timeout_s=settings.node_timeout_s,
            node_timeouts=settings.node_timeouts,
            max_attempts=settings.max_attempts,
            retry_backoff_s=settings.retry_backoff_s,
            claim_ttl_s=settings.claim_ttl_s,
            archive=settings.archive,
            quality_gate=settings.quality_gate,
            mask_spot_check=settings.mask_spot_check,
            auto_approve=auto_approve_of(settings),
        ),
        timeout_s=settings.store_timeout_s + blocking_s,
    )
