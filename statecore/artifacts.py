"""Content-addressed blobs (input images, masks, cut-outs, cached embeddings) through fsspec.

Images never go into Redis; job state keeps only names. The root is
``file://<data-dir>/artifacts`` by default, ``s3://bucket/prefix`` on a cluster.
Names are ``<kind>_<sha256[:32]>.<ext>`` so the same bytes are stored once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile

import fsspec

NAME_RE = re.compile(r"^[a-z]+_[0-9a-f]{16,64}\.(png|jpg|webp|npz|pt)$")


class ArtifactStore:
    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.fs, self.path = fsspec.core.url_to_fs(self.root)
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
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
        if not self.fs.exists(self._full(name)):
            self._write(name, data)
        elif self.local:  # the same bytes again: renew its time, so artifact GC sees it in use (archive.gc)
            with contextlib.suppress(FileNotFoundError):
                os.utime(self._full(name))
        return name

    def put_named(self, name: str, data: bytes) -> str:
        """Store under a caller-chosen valid name (e.g. an embedding keyed by image hash)."""
        self._write(name, data)
        return name

    def _write(self, name: str, data: bytes) -> None:
        """All or nothing, safe against concurrent writers of the same name.

        On a local disk: a temporary file with a unique name beside the target, then an atomic
        rename, so a reader sees the old file, the new file or none, never a part. An object
        store (S3, GCS) makes a single PUT visible atomically by itself."""
        full = self._full(name)
        if not self.local:
            self.fs.pipe_file(full, data)
            return
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, full)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def exists(self, name: str) -> bool:
        try:
            return bool(self.fs.exists(self._full(name)))
        except ValueError:
            return False

    def modified(self, name: str) -> float | None:
        """When the blob was last written (epoch seconds); None when it does not exist."""
        try:
            info = self.fs.info(self._full(name))
        except FileNotFoundError:
            return None
        t = info.get("mtime", info.get("LastModified", info.get("updated")))
        if isinstance(t, (int, float)):
            return float(t)
        if t is None:
            return 0.0  # a store that keeps no time: as old as can be
        return float(t.timestamp()) if hasattr(t, "timestamp") else 0.0

    def delete(self, name: str) -> None:
        """Remove the blob (artifact GC); a blob already gone is fine."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._full(name))

    def get(self, name: str) -> bytes:
        with self.fs.open(self._full(name), "rb") as f:
            data: bytes = f.read()
        return data

    @staticmethod
    def url(name: str) -> str:
        return f"/api/v1/artifacts/{name}"
