"""Request building and one call with its retries: the base ``ClientCore`` builds every operation on.

A request carries the token, a ``User-Agent`` and its timeouts; ``call`` sends
it until a success, a final error (mapped by ``client.errors``) or the end of
the retries ``client.retry`` allows.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import quote

import httpx

from .errors import ConnectionFailed, error_from_response
from .retry import RetryMode, RetryPolicy
from .steps import Plan, Send, Sleep
from .wire import API, USER_AGENT, new_request_id, normalize_base_url

log = logging.getLogger(__name__)

# The server sends a comment at least every 15 s; four silent intervals mean the stream is dead.
SSE_READ_TIMEOUT = 60.0


class CallCore:
    """Configuration, request building, and one call with retries."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout: float,
        policy: RetryPolicy,
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.token = token
        self.timeout = timeout
        self.policy = policy
        self.extra_headers = dict(extra_headers or {})

    # ------------------------------------------------------------------ requests

    def headers(self) -> dict[str, str]:
        """Headers every request carries."""
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **self.extra_headers}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        **kwargs: Any,
    ) -> httpx.Request:
        """A complete request (URL, headers, timeouts): the clients send it as it is."""
        t = timeout or httpx.Timeout(self.timeout)
        return httpx.Request(
            method,
            self.base_url + path,
            headers={**self.headers(), **(headers or {})},
            extensions={"timeout": t.as_dict()},
            **kwargs,
        )

    def artifact_path(self, url_or_name: str) -> str:
        """The path of an artifact given as results give it, as a root-relative URL, or as a bare name."""
        ref = url_or_name.strip()
        if ref.startswith(("http://", "https://")):
            url, base = httpx.URL(ref), httpx.URL(self.base_url)
            if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
                raise ValueError(f"refusing to send the API token to another origin: {ref}")
            return url.raw_path.decode("ascii")
        if ref.startswith("/"):
            return ref
        if ref.startswith(API.lstrip("/") + "/"):
            return "/" + ref
        return f"{API}/artifacts/{quote(ref, safe='')}"

    def stream_timeout(self, deadline: float | None) -> httpx.Timeout:
        read = SSE_READ_TIMEOUT
        if deadline is not None:
            read = max(0.5, min(read, deadline - time.monotonic() + 1.0))
        return httpx.Timeout(self.timeout, read=read)

    # ------------------------------------------------------------------ one call, with retries

    def call(
        self,
        method: str,
        path: str,
        *,
        mode: RetryMode = RetryMode.IDEMPOTENT,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Plan[httpx.Response]:
        """Send until a success (returned), a final error (raised as ``ApiError``) or the retries run out.

        Every attempt carries the same ``X-Request-ID``, so server logs show one call.
        """
        headers = {**(headers or {}), "X-Request-ID": new_request_id()}
        attempt = 0
        while True:
            try:
                resp: httpx.Response = yield Send(self.request(method, path, headers=headers, **kwargs))
            except httpx.TransportError as exc:
                delay = self.policy.after_error(attempt, exc, mode)
                if delay is None:
                    raise ConnectionFailed(
                        f"{method} {self.base_url}{path} failed: {exc!r}",
                        url=self.base_url + path,
                        attempts=attempt + 1,
                    ) from exc
                log.info("retrying %s %s in %.2fs after %r", method, path, delay, exc)
            else:
                if resp.status_code < 400:
                    return resp
                err = error_from_response(resp)
                delay = self.policy.after_status(attempt, resp.status_code, mode, err.retry_after)
                if delay is None:
                    raise err
                log.info("retrying %s %s in %.2fs after %s", method, path, delay, resp.status_code)
            attempt += 1
            yield Sleep(delay)
