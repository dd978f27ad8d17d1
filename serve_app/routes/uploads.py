"""Uploaded images: the multipart body read under a byte limit, then checks that decode it.

Reading: a ``Content-Length`` beyond the limit is refused before a byte is read; otherwise the
body is parsed as it streams in and the image part is refused the moment it passes the limit,
so no more than the limit is ever buffered (the part is held in memory, never spooled to disk).

Checking (CPU work, run in a worker thread so the event loop that serves the API and the
dispatcher never stalls on a 50-megapixel decode): the format is sniffed from the bytes, the
pixel count is checked from the header before anything is decoded, the whole image is decoded
(a truncated file fails here), and a photo's EXIF orientation is applied to the pixels, so the
stored image is upright and the boxes drawn on it line up with what a phone showed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import warnings
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageOps, UnidentifiedImageError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request

from hitl_review.statecore.errors import InvalidRequest, PayloadTooLarge
from hitl_review.statecore.media import sniff

# The upload is parsed here (streamed under the byte limit), not by FastAPI, so the schema of its
# body is spelled out for POST /jobs (serve_app.routes.api), /docs and the schema-driven fuzzer.
UPLOAD_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {"image": {"type": "string", "format": "binary", "description": "PNG, JPEG or WebP"}},
                }
            }
        },
    }
}

EXTENSIONS = {"png": "png", "jpeg": "jpg", "webp": "webp"}
PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
MULTIPART_OVERHEAD = 16 * 1024  # boundaries and part headers around the image
EXIF_ORIENTATION = 0x0112


@dataclass
class CheckedImage:
    data: bytes
    sha256: str
    width: int
    height: int
    ext: str
    rotated: bool = False


@dataclass
class Upload:
    filename: str | None
    data: bytes
    fields: dict[str, str] = dataclasses.field(default_factory=dict)  # the text fields read beside the file


class _CappedParser(MultiPartParser):
    """Starlette's multipart parser, refusing a file part the moment it passes ``max_file_bytes``
    (before the chunk that would pass it is written anywhere)."""

    def __init__(self, request: Request, max_file_bytes: int) -> None:
        super().__init__(request.headers, request.stream(), max_files=1, max_fields=8, max_part_size=64 * 1024)
        self.spool_max_size = max_file_bytes + 1  # keep the part in memory: it is bounded anyway
        self.max_file_bytes = max_file_bytes
        self._file_bytes = 0

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._current_part.file is not None:
            self._file_bytes += end - start
            if self._file_bytes > self.max_file_bytes:
                raise PayloadTooLarge(f"upload is over the limit of {self.max_file_bytes} bytes", field="image")
        super().on_part_data(data, start, end)


async def read_upload(request: Request, *, field: str, max_bytes: int, text_fields: tuple[str, ...] = ()) -> Upload:
    """The bytes of multipart field ``field``, never buffering more than ``max_bytes`` of them;
    ``text_fields``: the optional text fields read too (each 64 KiB at most)."""
    length = request.headers.get("content-length")
    if length is not None and length.isascii() and length.isdigit() and int(length) > max_bytes + MULTIPART_OVERHEAD:
        raise PayloadTooLarge(f"upload is {int(length)} bytes; the limit is {max_bytes}", field=field)
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise InvalidRequest(f"send the image as multipart/form-data in the field {field!r}", field=field)
    try:
        form = await _CappedParser(request, max_bytes).parse()
    except MultiPartException as e:
        raise InvalidRequest(f"malformed multipart body: {e.message}", field=field) from e
    except ClientDisconnect as e:
        raise InvalidRequest("the client went away before the upload finished", field=field) from e
    try:
        part = form.get(field)
        if not isinstance(part, UploadFile):
            raise InvalidRequest(f"field {field!r} is required: the image file", field=field)
        await part.seek(0)
        texts = {}
        for name in text_fields:
            value = form.get(name)
            if isinstance(value, UploadFile):
                raise InvalidRequest(f"field {name!r} is text, not a file", field=name)
            if value is not None:
                texts[name] = value
        return Upload(filename=part.filename, data=await part.read(), fields=texts)
    finally:
        await form.close()


def check_image(data: bytes, *, max_bytes: int, max_pixels: int, filename: str | None = None) -> CheckedImage:
    """Decode and validate an upload; upright it by its EXIF orientation. CPU-bound: call off the loop."""
    name = f" {filename!r}" if filename else ""
    if not data:
        raise InvalidRequest(f"upload{name} is empty (0 bytes)", field="image")
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"upload{name} is {len(data)} bytes; the limit is {max_bytes}", field="image")
    fmt = sniff(data)
    if fmt is None:
        raise InvalidRequest(f"upload{name} is not a PNG, JPEG or WebP image", field="image")
    too_many = PayloadTooLarge(f"image{name} has more pixels than the limit of {max_pixels}", field="image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if width * height > max_pixels:
                raise PayloadTooLarge(
                    f"image{name} has {width}x{height} pixels; the limit is {max_pixels}", field="image"
                )
            img.load()  # decodes everything: a truncated file fails here
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise too_many from e  # PIL's own bomb guard: the header already says too many pixels
    except PayloadTooLarge:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise InvalidRequest(f"upload{name} is a damaged or truncated {fmt.upper()} file: {e}", field="image") from e
    if width < 1 or height < 1:
        raise InvalidRequest(f"image{name} has no pixels", field="image")
    rotated = False
    if img.getexif().get(EXIF_ORIENTATION, 1) in range(2, 9):  # 1 is upright; others are not EXIF
        upright = ImageOps.exif_transpose(img)
        width, height = upright.size
        data = _encode(upright, fmt)
        rotated = True
    return CheckedImage(
        data=data,
        sha256=hashlib.sha256(data).hexdigest(),
        width=width,
        height=height,
        ext=EXTENSIONS[fmt],
        rotated=rotated,
    )


def _encode(img: Image.Image, fmt: str) -> bytes:
    """Re-encode an uprighted image in its own format (the orientation tag is gone with the rotation)."""
    buf = io.BytesIO()
    if fmt == "jpeg":
        img.save(buf, format="JPEG", quality=95)
    elif fmt == "webp":
        img.save(buf, format="WEBP", quality=95)
    else:
        img.save(buf, format="PNG")
    return buf.getvalue()
