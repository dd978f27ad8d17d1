"""When a request may be sent again, and after how long. Pure: no I/O, no sleeping.

Three kinds of request:

* ``IDEMPOTENT``: GETs, POST /jobs with an Idempotency-Key, interventions (they
  carry ``intervention_id``), cancel (idempotent, docs/protocol.md § Routes). Sending them twice is
  harmless, so connection errors, 502/503/504 and 429 are retried.
* ``CONNECT_ONLY``: POST /jobs without an Idempotency-Key. Once the request may
  have reached the server a second send could create a second job, so only
  failures that prove it never left (connect errors, pool timeouts) are retried,
  and a 429 (``BACKLOG_FULL``: admission control refuses before anything is
  written), after its ``Retry-After``. A 503 is not: ``STORE_UNAVAILABLE`` may
  come after the job was written.
* ``NEVER``: probes such as /readyz, where the answer itself is the information.

No other 4xx is ever retried; a 409 in particular is the server's final word.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

import httpx

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# A server asking for more than this is treated as asking for this much.
MAX_RETRY_AFTER = 120.0

# Errors after which the request may or may not have been processed.
_MAYBE_SENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
# Errors that prove the request never reached the server.
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class RetryMode(enum.Enum):
    IDEMPOTENT = "idempotent"
    CONNECT_ONLY = "connect_only"
    NEVER = "never"


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 5
    backoff: float = 0.2
    backoff_max: float = 5.0

    def backoff_delay(self, attempt: int) -> float:
        """Exponential delay for retry number ``attempt`` (0-based), capped, with jitter in [d/2, d]."""
        d = min(self.backoff_max, self.backoff * 2.0**attempt)
        return d / 2 + random.random() * d / 2

    def after_error(self, attempt: int, error: Exception, mode: RetryMode) -> float | None:
        """Delay before retrying after a transport error, or None to give up."""
        if attempt >= self.retries or mode is RetryMode.NEVER:
            return None
        allowed = _NEVER_SENT if mode is RetryMode.CONNECT_ONLY else _NEVER_SENT + _MAYBE_SENT
        if not isinstance(error, allowed):
            return None
        return self.backoff_delay(attempt)

    def after_status(
        self, attempt: int, status: int, mode: RetryMode, retry_after: float | None = None
    ) -> float | None:
        """Delay before retrying after an HTTP error status, or None to give up."""
        if attempt >= self.retries or status not in RETRY_STATUSES or mode is RetryMode.NEVER:
            return None
        if mode is RetryMode.CONNECT_ONLY and status != 429:  # a 429 refused before anything was written
            return None
        if retry_after is not None and status in (429, 503):
            return min(retry_after, MAX_RETRY_AFTER)
        return self.backoff_delay(attempt)
