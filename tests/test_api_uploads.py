"""Uploads against the real control plane (uvicorn, real Redis): the byte limit is enforced while
the body streams in, the pixel limit is a 413 for images whose header really decodes, the decode
runs off the event loop, and EXIF orientation is applied before boxes are drawn on the image."""

from __future__ import annotations

import asyncio
import io
import socket

import httpx
import pytest
from PIL import Image
from starlette.requests import Request

from hitl_review.serve_app.routes import api as serve_api
from hitl_review.statecore.errors import PayloadTooLarge

from .api_util import auth, get, submit, wait_status


@pytest.fixture(scope="module")
def c(api_server):
    with httpx.Client(base_url=api_server.url, timeout=60) as client:
        yield client


def _job_count(c: httpx.Client) -> int:
    return len(c.get("/api/v1/jobs", params={"limit": 500}, headers=auth("admin")).json()["jobs"])


def _png(size: tuple[int, int], mode: str = "L") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


@pytest.mark.parametrize("size", [(8000, 7000), (15000, 14000)], ids=["56MP", "210MP-pil-bomb"])
def test_an_image_over_the_pixel_limit_is_413(c, api_server, size):
    """A real PNG whose header decodes (unlike a patched header with a bad CRC): over the limit is 413,
    also past PIL's own bomb guard (which used to read as a damaged file, 400)."""
    data = _png(size)
    assert len(data) < api_server.settings.max_upload_bytes
    assert size[0] * size[1] > api_server.settings.max_pixels
    before = _job_count(c)
    r = submit(c, data)
    assert r.status_code == 413 and r.json()["code"] == "PAYLOAD_TOO_LARGE", r.text
    assert "pixels" in r.json()["message"]
    assert _job_count(c) == before


def test_a_declared_content_length_over_the_limit_is_refused_before_the_body(api_server):
    """The server answers 413 having read only the headers: no body byte is ever sent."""
    host, port = api_server.url.removeprefix("http://").split(":")
    boundary = "b0undary"
    head = (
        f"POST /api/v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {auth('sub1')['Authorization'][7:]}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {10**10}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode())
        raw = b""
        while b"}" not in raw:
            data = sock.recv(65536)
            if not data:
                break
            raw += data
    assert raw.startswith(b"HTTP/1.1 413"), raw[:200]
    assert b"PAYLOAD_TOO_LARGE" in raw


def test_a_streamed_body_over_the_limit_is_413_and_nothing_is_created(c, api_server):
    """No Content-Length (chunked): the limit is enforced by counting while parsing."""
    limit = api_server.settings.max_upload_bytes
    before = _job_count(c)

    def body():
        yield b'--xyz\r\nContent-Disposition: form-data; name="image"; filename="big.png"\r\n\r\n'
        yield b"\x89PNG\r\n\x1a\n"
        for _ in range(limit // 65536 + 4):
            yield b"\x00" * 65536
        yield b"\r\n--xyz--\r\n"

    r = c.post(
        "/api/v1/jobs", content=body(), headers={**auth("sub1"), "Content-Type": "multipart/form-data; boundary=xyz"}
    )
    assert r.status_code == 413 and r.json()["code"] == "PAYLOAD_TOO_LARGE", r.text
    assert _job_count(c) == before


async def test_read_upload_never_pulls_or_buffers_more_than_the_limit():
    """The reader stops pulling body chunks once the image part passes the limit."""
    from hitl_review.serve_app.routes.uploads import read_upload

    limit, chunk = 200_000, 8192
    pulled = 0
    total_chunks = 200

    async def receive():
        nonlocal pulled
        await asyncio.sleep(0)
        if pulled == 0:
            pulled += 1
            return {
                "type": "http.request",
                "more_body": True,
                "body": b'--xyz\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n',
            }
        pulled += 1
        return {"type": "http.request", "body": b"\x01" * chunk, "more_body": pulled < total_chunks}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/jobs",
        "query_string": b"",
        "headers": [(b"content-type", b"multipart/form-data; boundary=xyz")],
    }
    with pytest.raises(PayloadTooLarge):
        await read_upload(Request(scope, receive), field="image", max_bytes=limit)
    assert (pulled - 1) * chunk <= limit + chunk  # stopped at the first chunk past the limit
    assert pulled < total_chunks


def test_decoding_runs_off_the_event_loop(c, monkeypatch):
    """The decode and hash of an upload run in a worker thread, not on the loop that also serves
    the API and the dispatcher."""
    seen: list[bool] = []
    original = serve_api.check_image

    def spy(*args, **kwargs):
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:
            seen.append(False)
        return original(*args, **kwargs)

    monkeypatch.setattr(serve_api, "check_image", spy)
    r = submit(c, _png((64, 48), "RGB"))
    assert r.status_code == 202, r.text
    assert seen == [False], "check_image ran on the event loop"


def test_exif_orientation_is_applied_at_upload(c):
    """A phone photo stored landscape with orientation 6 ("rotate 90° clockwise to view") becomes a
    portrait image: the job's size, the stored bytes and the detector all see it upright."""
    img = Image.new("RGB", (120, 80), (250, 250, 250))
    img.paste((20, 20, 200), (10, 20, 40, 60))
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    img.save(buf, format="JPEG", exif=exif.tobytes(), quality=95)
    r = submit(c, buf.getvalue(), filename="phone.jpg")
    assert r.status_code == 202, r.text
    snap = get(c, r.json()["job_id"])
    assert (snap["image"]["width"], snap["image"]["height"]) == (80, 120)
    stored = c.get(snap["image"]["url"], headers=auth("admin"))
    assert stored.status_code == 200
    upright = Image.open(io.BytesIO(stored.content))
    assert upright.size == (80, 120)
    assert upright.getexif().get(0x0112, 1) == 1
    # Turning 90° clockwise maps (x, y) to (79 - y, x): the blue patch at x 10-40 / y 20-60 of the
    # landscape pixels is at x 19-59 / y 10-40 upright.
    r_, g_, b_ = upright.convert("RGB").getpixel((40, 25))
    assert b_ > 150 and r_ < 100, (r_, g_, b_)
    done = wait_status(c, snap["job_id"], {"WAITING_USER_SELECTION", "EMPTY_SELECTION", "FAILED"})
    for box in done["box_list"]:
        x1, y1, x2, y2 = box["bbox"]
        assert x2 <= 80 and y2 <= 120
