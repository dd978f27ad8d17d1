"""A real PostgreSQL on loopback for the tests and benchmarks of the archive (docs/archive.md).

``initdb`` + ``pg_ctl`` in a temporary directory on a free port, as ``serve_app.ops.redis_server`` does
for redis-server: trust authentication, listening on 127.0.0.1 only, its socket in the directory.
Debian puts the binaries under ``/usr/lib/postgresql/<version>/bin`` (not on PATH).

``initdb`` refuses to run as root. As root the cluster is created and run as the ``postgres``
user (which Debian's package creates) through ``runuser``, in a directory under the system's
temporary directory that this user owns (pytest's own temporary directories are private to root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hitl_review.serve_app.ops.ports import free_port

RUN_AS = "postgres"  # the account Debian's postgresql package creates


def find_pg_bin(name: str = "initdb") -> str | None:
    """The directory holding PostgreSQL's server binaries (newest version first), or None."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        if os.access(os.path.join(d, name), os.X_OK):
            return d
    on_path = shutil.which(name)  # resolved: a link on PATH points at the directory with the others
    return str(Path(on_path).resolve().parent) if on_path else None


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(p) for p in version.split(".") if p.isdigit())


@dataclass
class PostgresServer:
    """One PostgreSQL cluster with a database ``hitl``; ``url`` is a SQLAlchemy URL (psycopg 3)."""

    bin_dir: str
    port: int = 0
    base: Path | None = None
    user: str = ""
    _as_root: bool = field(default=False, init=False)

    @property
    def data_dir(self) -> Path:
        assert self.base is not None
        return self.base / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/hitl"

    def _cmd(self, *argv: str) -> list[str]:
        if self._as_root:
            return ["runuser", "-u", RUN_AS, "--", *argv]
        return list(argv)

    def _run(self, *argv: str, timeout: float = 120) -> None:
        proc = subprocess.run(self._cmd(*argv), capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")

    def start(self, timeout: float = 60) -> PostgresServer:
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> PostgresServer:
        self._as_root = os.geteuid() == 0
        self.base = Path(tempfile.mkdtemp(prefix="hitl-pg-"))
        if self._as_root:
            pw = pwd.getpwnam(RUN_AS)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
            self.user = RUN_AS
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        self.port = self.port or free_port()
        b = self.bin_dir
        self._run(f"{b}/initdb", "-A", "trust", "-U", self.user, "-E", "UTF8", "--no-sync", "-D", str(self.data_dir))
        options = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
        )
        self._run(
            f"{b}/pg_ctl",
            "-D",
            str(self.data_dir),
            "-o",
            options,
            "-l",
            str(self.base / "log"),
            "-w",
            "start",
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        while True:
            created = subprocess.run(
                self._cmd(f"{b}/createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "hitl"),
                capture_output=True,
                text=True,
                timeout=30,
            )
            if created.returncode == 0:
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"createdb failed: {created.stderr.strip()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.base is None:
            return
        if (self.data_dir / "postmaster.pid").exists():
            subprocess.run(
                self._cmd(f"{self.bin_dir}/pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"),
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(self.base, ignore_errors=True)
        self.base = None

    def reset(self) -> None:
        """Drop and recreate the database ``hitl`` (a fresh, empty archive for each test)."""
        b = self.bin_dir
        conn = ("-h", "127.0.0.1", "-p", str(self.port), "-U", self.user)
        self._run(f"{b}/dropdb", *conn, "--if-exists", "--force", "hitl")
        self._run(f"{b}/createdb", *conn, "hitl")


def require_postgres() -> str:
    """The server binaries' directory, or :func:`harness.ci.missing` (skip locally, fail under CI)."""
    from .ci import missing

    found = find_pg_bin("initdb")
    if found is None or not os.access(os.path.join(found, "pg_ctl"), os.X_OK):
        missing("PostgreSQL server (initdb, pg_ctl; Debian package postgresql)")
    return found
