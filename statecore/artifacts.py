"""Content-addressed blobs (input images, masks, cut-outs, cached embeddings) through fsspec.

Images never go into Redis; job state keeps only names. The root is
``file://<data-dir>/artifacts`` by default, ``s3://bucket/prefix`` on a cluster.
Names are ``<kind>_<sha256[:32]>.<ext>`` so the same bytes are stored once.
"""
from __future__ import annotations

import hashlib
import re

import fsspec

NAME_RE = re.compile(r"^[a-z]+_[0-9a-f]{16,64}\.(png|jpg|webp|npz|pt)$")


class ArtifactStore:
    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.fs, self.path = fsspec.core.url_to_fs(self.root)
        self.fs.makedirs(self.path, exist_ok=True)

    def _full(self, name: str) -> str:
        if not NAME_RE.match(name):
            raise ValueError(f"invalid artifact name {name!r}")
        return f"{self.path}/{name}"

    @staticmethod
    def name_for(kind: str, data: bytes, ext: str) -> str:
        return f"{kind}_{hashlib.sha256(data).hexdigest()[:32]}.{ext}"

    def put(self, kind: str, data: bytes, ext: str) -> str:
        """Store ``data`` once under its content hash and return its name."""
        name = self.name_for(kind, data, ext)
        full = self._full(name)
        if not self.fs.exists(full):
            tmp = f"{full}.tmp"
            with self.fs.open(tmp, "wb") as f:
                f.write(data)
            self.fs.mv(tmp, full)
        return name

    def put_named(self, name: str, data: bytes) -> str:
        """Store under a caller-chosen valid name (e.g. an embedding keyed by image hash)."""
        full = self._full(name)
        tmp = f"{full}.tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, full)
        return name

    def exists(self, name: str) -> bool:
        try:
            return self.fs.exists(self._full(name))
        except ValueError:
            return False

    def get(self, name: str) -> bytes:
        with self.fs.open(self._full(name), "rb") as f:
            return f.read()

    @staticmethod
    def url(name: str) -> str:
        return f"/api/v1/artifacts/{name}"
