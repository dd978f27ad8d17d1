"""Whether the ports ``hitl up`` is asked to listen on are free, said in one line before Ray starts
(a taken port would otherwise surface half a minute later as Serve's ``NoAvailablePortError``).

A port is taken when another socket listens on it: the bind test uses ``SO_REUSEADDR``, as the
servers do (``serve_app.serving.ray_runtime.reuse_ingress_address``), so the connections a crashed
predecessor left behind (TIME_WAIT) do not count: a restart on the same port goes ahead at once.
Only connections of a server that did not set ``SO_REUSEADDR`` itself (a build before this one)
still hold the port, until the kernel lets them go (60 s): that is waited for, and said.

Free ports for what binds later (:func:`quiet_port`): a port from the kernel's ephemeral range
(32768-60999 on Linux) is what every outgoing connection takes as its local port, so one picked
now and bound seconds later (by Ray's start, by Serve's Api replica) can be taken meanwhile by one
of the many sockets Ray's processes open, and the bind fails (seen in CI: the head proxy's port,
then the direct-ingress Api replica's ``NoAvailablePortError``). What binds at once (a
``redis-server`` started on the next line) may take :func:`free_port`.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import time

import psutil

log = logging.getLogger("hitl.ports")


def holder(port: int) -> str | None:
    """Who listens on ``port``: ``pid 123 (redis-server)``, ``another process`` (one this user may
    not name), or None when nobody listens (only connections linger on it)."""
    try:
        listeners = [
            c
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        ]
    except psutil.Error:
        return "another process"
    for c in listeners:
        if c.pid:
            try:
                return f"pid {c.pid} ({psutil.Process(c.pid).name()})"
            except psutil.Error:
                return f"pid {c.pid}"
    return "another process" if listeners else None


def _bind(host: str, port: int) -> OSError | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def taken(host: str, port: int, linger_s: float = 65.0) -> str | None:
    """None when ``host:port`` can be listened on (after up to ``linger_s`` for connections that
    outlived their server); else why not, in words."""
    deadline = time.monotonic() + linger_s
    said = False
    while (e := _bind(host, port)) is not None:
        if e.errno != errno.EADDRINUSE:
            return e.strerror or str(e)
        who = holder(port)
        if who is not None:
            return f"in use by {who}"
        if time.monotonic() > deadline:
            return "held by connections that outlived their server"
        if not said:
            log.warning(
                "port %d: connections of an earlier server linger on it; waiting for the kernel to free it", port
            )
            said = True
        time.sleep(0.5)
    return None


def check(host: str, ports: dict[str, int]) -> None:
    """SystemExit naming the first of ``ports`` (flag -> port) that cannot be listened on."""
    for flag, port in ports.items():
        why = taken(host, port)
        if why is not None:
            raise SystemExit(
                f"hitl up: cannot listen on {host}:{port} ({flag}): {why}. Stop it, or pass another {flag}."
            )


def free_port(max_port: int = 65535) -> int:
    """A free loopback port; ``max_port`` bounds it (a cluster node also listens on port+10000)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port <= max_port:
            return port


def free_cluster_port() -> int:
    """A free port for a cluster node: at most 55535 (redis-server refuses more in
    cluster mode) and whose cluster bus port (+10000) is free as well."""
    while True:
        port = free_port(55535)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


# Ports this process has handed out or been told are spoken for (``--api-port``, ``--ui-port``):
# free now, but their owner binds them later (the Api replica some seconds after Ray starts),
# so a second pick must not return one of them.
_SPOKEN_FOR: set[int] = set()


def reserve(*ports: int | None) -> None:
    """Mark ``ports`` as spoken for: :func:`quiet_port` will not hand them out."""
    _SPOKEN_FOR.update(p for p in ports if p)


def quiet_port(low: int = 20000, high: int = 32767) -> int:
    """A free loopback port between Ray's worker ports (10002-19999) and the kernel's ephemeral
    range, where no outgoing connection takes it before its owner binds it; never one this
    process handed out before or was told is spoken for (:func:`reserve`)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(low, high)
        if port not in _SPOKEN_FOR and port_free("127.0.0.1", port):
            _SPOKEN_FOR.add(port)
            return port
    while (port := free_port()) in _SPOKEN_FOR:
        continue
    _SPOKEN_FOR.add(port)
    return port


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
