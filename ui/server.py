"""Serving the reviewer app: what ``hitl up`` (and ``python -m hitl_review.ui``) call."""

from __future__ import annotations

import builtins
import importlib
import os
from typing import Any

from starlette.middleware import Middleware

from . import cookie_signin
from .app import build_app, default_store_root

# Open review panels follow their jobs' event streams on the event loop (ui.pump), so Gradio's worker
# pool only runs the short handlers; many reviewers clicking at once still need more than the default 40.
MAX_THREADS = 256


def quiet_asset_prints() -> None:
    """Silence the one line Gradio prints per custom-component asset it serves.

    ``gradio.routes`` answers ``/custom_component/{id}/{environment}/{type}/{file_name}`` after a bare
    ``print(f"id=…, environment=…, type=…, file_name=…")``: every page load wrote five such lines
    (the annotator's scripts and stylesheet) to the UI's stdout, i.e. into `hitl up`'s log. Only
    that debug line is dropped (a module-level ``print`` shadows the builtin in ``gradio.routes``
    alone); everything else that module prints, and every error (logged, or a 404 raised by the
    route itself), still comes through.
    """
    routes: Any = importlib.import_module("gradio.routes")

    def print_unless_asset_line(*args: Any, **kwargs: Any) -> None:
        if len(args) == 1 and isinstance(args[0], str) and args[0].startswith("id=") and ", file_name=" in args[0]:
            return
        builtins.print(*args, **kwargs)

    routes.print = print_unless_asset_line  # shadows the builtin in that module only


def launch(
    api_url: str,
    host: str = "127.0.0.1",
    port: int = 7860,
    token: str | None = None,
    require_login: bool = False,
    labels: tuple[str, ...] | None = None,
    trusted_proxies: tuple[str, ...] = (),
) -> None:
    """Serve the reviewer UI until interrupted (blocks the calling thread)."""
    quiet_asset_prints()
    if trusted_proxies:  # the peer address decides (ui.signin): uvicorn must not rewrite it from X-Forwarded-For
        os.environ["FORWARDED_ALLOW_IPS"] = ""
    demo = build_app(api_url, token, require_login=require_login, labels=labels, trusted_proxies=trusted_proxies)
    demo.launch(
        server_name=host,
        server_port=port,
        max_threads=MAX_THREADS,
        show_error=True,
        quiet=True,
        ssr_mode=False,
        footer_links=[],
        # Gradio's run history keeps every call's inputs and outputs in the browser's localStorage, re-written on
        # each message of each event: a sign-in's token stored in clear, and most of the page's main-thread time
        # on the way to an open panel (a CPU profile of N and Enter: ~0.5 s of localStorage.setItem in 8 s).
        run_history=False,
        # The queue's thumbnails are files Gradio serves (ui.queue.thumb_cell); nothing else of the store is.
        allowed_paths=[str(default_store_root() / "thumbs")],
        app_kwargs=app_kwargs(api_url),
    )


def app_kwargs(api_url: str) -> dict[str, Any]:
    """What the page's server adds to Gradio's app: the sign-in and sign-out routes, and no write from
    another origin (ui.cookie_signin)."""
    return {"routes": cookie_signin.routes(api_url), "middleware": [Middleware(cookie_signin.OriginCheck)]}
