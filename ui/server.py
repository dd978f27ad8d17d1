"""Serving the reviewer app: what ``hitl up`` (and ``python -m ui``) call."""

from __future__ import annotations

from .app import build_app

# Open review panels follow their jobs' event streams on the event loop (ui.pump), so Gradio's worker
# pool only runs the short handlers; many reviewers clicking at once still need more than the default 40.
MAX_THREADS = 256


def launch(
    api_url: str, host: str = "127.0.0.1", port: int = 7860, token: str | None = None, require_login: bool = False
) -> None:
    """Serve the reviewer UI until interrupted (blocks the calling thread)."""
    demo = build_app(api_url, token, require_login=require_login)
    demo.launch(
        server_name=host,
        server_port=port,
        max_threads=MAX_THREADS,
        show_error=True,
        quiet=True,
        ssr_mode=False,
        footer_links=[],
    )
