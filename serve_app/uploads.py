"""Checks on uploaded images: format sniffed from the bytes, size and pixel limits."""
from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from statecore.errors import InvalidRequest, PayloadTooLarge
from statecore.media import sniff

EXTENSIONS = {"png": "png", "jpeg": "jpg", "webp": "webp"}


@dataclass
class CheckedImage:
    data: bytes
    sha256: str
    width: int
    height: int
    ext: str


def check_image(data: bytes, *, max_bytes: int, max_pixels: int, filename: str | None = None) -> CheckedImage:
    name = f" {filename!r}" if filename else ""
    if not data:
        raise InvalidRequest(f"upload{name} is empty (0 bytes)", field="image")
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"upload{name} is {len(data)} bytes; the limit is {max_bytes}", field="image")
    fmt = sniff(data)
    if fmt is None:
        raise InvalidRequest(f"upload{name} is not a PNG, JPEG or WebP image", field="image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if width * height > max_pixels:
                raise PayloadTooLarge(f"image{name} has {width}x{height} pixels; the limit is {max_pixels}",
                                      field="image")
            img.load()  # decodes everything: a truncated file fails here
    except PayloadTooLarge:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombWarning,
            Image.DecompressionBombError) as e:
        raise InvalidRequest(f"upload{name} is a damaged or truncated {fmt.upper()} file: {e}", field="image") from e
    if width < 1 or height < 1:
        raise InvalidRequest(f"image{name} has no pixels", field="image")
    return CheckedImage(data=data, sha256=hashlib.sha256(data).hexdigest(), width=width, height=height,
                        ext=EXTENSIONS[fmt])
