"""Python client of the hitl-review control plane: HTTP + SSE, the batch submitter, the CLI commands."""

from .api import AsyncHitlClient, HitlClient, InterventionResult, SubmitResult, WaitCancelled, new_intervention_id
from .batch import BatchSummary, FileOutcome, idempotency_key, run_batch, walk_inputs
from .config import ClientConfig, resolve_config
from .errors import (
    ApiError,
    AuthError,
    ConflictError,
    ConnectionFailed,
    HitlClientError,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    ServerError,
    WaitTimeout,
    is_conflict,
)
from .retry import RetryMode, RetryPolicy

__all__ = [
    "ApiError",
    "AsyncHitlClient",
    "AuthError",
    "BatchSummary",
    "ClientConfig",
    "ConflictError",
    "ConnectionFailed",
    "FileOutcome",
    "HitlClient",
    "HitlClientError",
    "InterventionResult",
    "InvalidRequestError",
    "NotFoundError",
    "RateLimitedError",
    "RetryMode",
    "RetryPolicy",
    "ServerError",
    "SubmitResult",
    "WaitCancelled",
    "WaitTimeout",
    "idempotency_key",
    "is_conflict",
    "new_intervention_id",
    "resolve_config",
    "run_batch",
    "walk_inputs",
]
