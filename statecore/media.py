"""The image formats hitl-review accepts (PNG, JPEG, WebP), recognised by their magic bytes.

Shared by the server's upload checks and the client's directory walk, so both agree."""

from __future__ import annotations

CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
EXTENSIONS = {"png": ".png", "jpeg": ".jpg", "webp": ".webp"}
SNIFF_BYTES = 12


def sniff(head: bytes) -> str | None:
    """``"png"``, ``"jpeg"`` or ``"webp"`` from the first bytes of a file, else None.

    Only the signature is checked; whether the rest of the file decodes is the
    server's call (it answers 400 for a truncated image).
    """
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    return None
