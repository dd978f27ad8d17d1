"""The sign-in a browser keeps (ui.signin): its localStorage entry, and the sign-out that forgets it."""

from __future__ import annotations

import hashlib

import gradio as gr

STORAGE_KEY = "hitl-review-sign-in"  # the browser's localStorage key of the kept sign-in
# Sign out: forget the kept sign-in and open the page afresh (without ?job=); leaving the page
# releases this session's claim (demo.unload).
SIGN_OUT_JS = f"() => {{ localStorage.removeItem({STORAGE_KEY!r}); window.location.href = window.location.pathname; }}"


def browser_state() -> gr.BrowserState:
    """Where the page keeps ``{"name", "token"}``. Gradio encrypts it with a key it also sends to the
    page: that guards against nothing, so the key is fixed, and a kept sign-in outlives a UI restart."""
    key = hashlib.sha256(b"hitl-review-ui-sign-in").hexdigest()[:32]
    return gr.BrowserState(None, storage_key=STORAGE_KEY, secret=key)
