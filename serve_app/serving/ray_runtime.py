"""Ray for ``hitl up``: a local cluster of its own, or an existing cluster joined with ``--ray-address``.

- Local: ``ray.init`` starts gcs_server, the raylet and (by default) the dashboard. Ray spawns its
  daemons with SIGINT blocked (and, on Linux, killed when this process dies) and its workers in
  process groups of their own, so a terminal's Ctrl-C reaches ``hitl up`` alone, which then stops
  everything in order (``serve_app.ops.stopping``).
- Joined: the project's packages reach every worker as ``py_modules`` of the job's runtime
  environment; Redis and the artifact store must be reachable from every node; GPUs are counted
  from the cluster's resources; the API is wherever the cluster's Serve proxy listens.

The HTTP path (``--ingress``, :func:`choose_ingress`): on a cluster of our own with one API
replica, Serve's direct ingress: the ``Api`` replica itself listens on ``--api-port`` (no proxy
hop: ~1.1x uvicorn's p50 instead of ~4x, docs/benchmarks.md § Interventions under load); Serve's
proxy, which Serve still starts on the head node, gets a free port of its own. Several API replicas,
or a joined cluster (whose proxies and environment are its own), keep Serve's proxies.
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from ..ops.config import Settings
from ..ops.ports import port_free, quiet_port

log = logging.getLogger("hitl.ray")

DEFAULT_DASHBOARD_PORT = 8265  # Ray's
# The project's packages (under hitl_review) the Serve application imports (its replicas, and the
# builder): the one list of what a cluster needs. Shipped to every node of a joined cluster inside the
# hitl_review package (runtime_env), copied into the KubeRay image (deploy/kuberay/Dockerfile);
# tests/test_cluster_packages.py checks both against the import graph of serve_app.application,
# serve_app.work.archiver_deployment and deployments.serve.
REPLICA_PACKAGES = ("statecore", "serve_app", "deployments", "archive")
RUNTIME_ENV_EXCLUDES = ["__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache"]


INGRESS_CHOICES = ("auto", "direct", "proxy")


@dataclass
class RayInfo:
    joined: bool  # an existing cluster (--ray-address), not one of our own
    dashboard_url: str | None  # http://host:port, or None when there is none
    ingress: str = "proxy"  # "direct": the Api replica listens on the API port; "proxy": Serve's proxies
    proxy_port: int | None = None  # under direct ingress, where Serve's (unused) head-node proxy listens
    metrics_port: int | None = None  # our own cluster: Ray's Prometheus endpoint (Serve's and the models' figures)


def choose_ingress(requested: str, settings: Settings) -> str:
    """``direct`` or ``proxy`` for ``--ingress auto|direct|proxy``. Direct ingress gives one fixed
    port to one replica, and its environment must reach Ray before Ray starts: so only on a
    cluster of our own with one API replica; ``auto`` picks it there and the proxy elsewhere."""
    if requested not in INGRESS_CHOICES:
        raise SystemExit(f"hitl up: --ingress {requested!r}: one of {', '.join(INGRESS_CHOICES)}")
    possible = not settings.ray_address and settings.api_replicas == 1
    if requested == "auto":
        return "direct" if possible else "proxy"
    if requested == "direct" and not possible:
        why = (
            "--ray-address joins a cluster whose Serve (proxies, environment) is its own"
            if settings.ray_address
            else f"--api-replicas {settings.api_replicas}: one API port cannot be held by several replicas"
        )
        raise SystemExit(f"hitl up: --ingress direct is not possible here: {why}; use --ingress proxy")
    return requested


def direct_ingress_env(api_port: int) -> dict[str, str]:
    """What Serve 2.60 reads (``ray.serve._private.constants``, at import, in the controller and
    the replicas, so it must be in the environment before ``ray.init`` starts the raylet):
    direct ingress with the throughput-optimised settings; the HTTP port range [api_port,
    api_port + 1) so the one Api replica takes exactly the API port; no draining period (a stop
    would otherwise wait 30 s for load balancers we do not have); no port quarantine (a replaced
    Api replica takes the same port again at once)."""
    return {
        "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(api_port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(api_port + 1),
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
    }


# Serve's controller runs its control loop every 0.1 s by default: on an idle `hitl up` that was 75 ms/s of
# CPU, the largest single share of the stack's idle cost (340 ms/s in all). Every 0.5 s it is 28 ms/s and the
# start is no slower (docs/scaling.md § The controller's loop); a caller's own value is kept.
CONTROL_LOOP_ENV = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5"}


def own_cluster_env() -> None:
    """What a cluster of our own reads at start (the controller, at its import): ``CONTROL_LOOP_ENV``
    unless the environment already names it. Not on a joined cluster, whose Serve is its operator's."""
    for key, value in CONTROL_LOOP_ENV.items():
        os.environ.setdefault(key, value)


def reuse_ingress_address() -> bool:
    """Let this process's direct-ingress server bind the API port while connections of a killed
    predecessor linger on it (TIME_WAIT, FIN_WAIT): the restart after a crash that systemd's
    ``Restart=`` or a container restart does, at once and on the same port (issue 19).

    Serve 2.60 binds the Api replica's socket without ``SO_REUSEADDR``, so for a minute after a
    SIGKILL the bind fails, Serve blocks the one port of the range and the replica never starts
    (``NoAvailablePortError``). Serve's only switch sets ``SO_REUSEPORT`` as well, which would let a
    second live process share the port; this keeps ``SO_REUSEADDR`` alone, so a port another
    process still listens on is refused as before. Called in the Api replica before Serve starts
    its server; False (and nothing changed) where Serve's internals are not as expected."""
    try:
        from ray.serve._private import http_util, replica
    except ImportError:
        return False
    start = getattr(replica, "start_asgi_http_server", None)
    if start is None or not hasattr(http_util, "set_socket_reuse_port"):
        log.warning("Serve's direct ingress is not as expected: a restart may wait for the API port")
        return False
    if getattr(start, "reuses_address", False):
        return True

    def reuse_address_only(sock: socket.socket) -> bool:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return True

    async def start_reusing_address(*args: Any, **kwargs: Any) -> Any:
        kwargs["enable_so_reuseport"] = True  # which now means SO_REUSEADDR alone
        return await start(*args, **kwargs)

    start_reusing_address.reuses_address = True  # type: ignore[attr-defined]  # a marker against patching twice
    http_util.set_socket_reuse_port = reuse_address_only
    replica.start_asgi_http_server = start_reusing_address
    return True


def serve_http_options(settings: Settings, info: RayInfo) -> dict[str, Any]:
    """``serve.start``'s ``http_options``: the proxy on the API port, or under direct ingress on
    a port of its own (the Api replica takes ``--api-port`` and the same host)."""
    port = info.proxy_port if info.ingress == "direct" and info.proxy_port else settings.api_port
    return {"host": settings.host, "port": port}


def dashboard_port(requested: int | None, host: str) -> int | None:
    """The dashboard's port for ``ray.init``. Not given: None, and Ray takes 8265 or, when that is
    taken (another Ray on this machine), the first free one of the 50 after it, binding as it
    goes (so two ``hitl up`` starting at once do not race for it); the READY line names the one
    taken. Given: that port, refused at once when it is taken; 0: any free port."""
    if requested == 0:
        return quiet_port()
    if requested is not None and not port_free(host, requested):
        raise SystemExit(f"hitl up: --dashboard-port {requested} is in use on {host}; pick another or pass 0")
    return requested


def runtime_env() -> dict[str, Any]:
    """The job's runtime environment on a joined cluster: the hitl_review package, found where this
    process imports it from (a checkout, whose subpackages are links Ray's packing follows, or an
    installed wheel alike); the UI and the client ride along (small, and imported by no replica)."""
    package = Path(importlib.import_module("hitl_review").__file__ or "").parent
    return {"py_modules": [str(package)], "excludes": list(RUNTIME_ENV_EXCLUDES)}


def start(
    settings: Settings, *, dashboard: bool, dashboard_port_requested: int | None, ingress: str = "auto"
) -> RayInfo:
    mode = choose_ingress(ingress, settings)
    proxy_port = None
    if mode == "direct":
        if not settings.api_port:
            settings.api_port = quiet_port()
        os.environ.update(direct_ingress_env(settings.api_port))
        proxy_port = quiet_port()
    elif not settings.ray_address:  # our own cluster: not direct because a caller's environment said so
        os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0"
    if not settings.ray_address:
        own_cluster_env()
    import ray

    kwargs: dict[str, Any] = {"namespace": "hitl", "log_to_driver": False, "logging_level": logging.WARNING}
    if settings.ray_address:
        ctx = ray.init(address=settings.ray_address, runtime_env=runtime_env(), **kwargs)
        url = _http(ctx.dashboard_url) if dashboard else None
        return RayInfo(joined=True, dashboard_url=url, ingress=mode)
    port = dashboard_port(dashboard_port_requested, settings.host) if dashboard else None
    metrics_port = quiet_port()
    # A local single-machine cluster: logical CPUs are resources, not cores; give the control
    # plane and three model deployments room even on a 2-core machine.
    ctx = ray.init(
        num_cpus=max(8, os.cpu_count() or 1),
        object_store_memory=256 * 1024 * 1024,
        _temp_dir=str(Path("/tmp") / f"hitl-ray-{os.getuid()}"),
        include_dashboard=dashboard,
        dashboard_host=settings.host,
        dashboard_port=port,
        _metrics_export_port=metrics_port,
        **kwargs,
    )
    url = _http(ctx.dashboard_url) if dashboard else None
    log.info(
        "Ray's metrics for Prometheus (Serve's and the model replicas' own): http://127.0.0.1:%d/metrics", metrics_port
    )
    return RayInfo(joined=False, dashboard_url=url, ingress=mode, proxy_port=proxy_port, metrics_port=metrics_port)


def _http(address: str | None) -> str | None:
    if not address:
        return None
    return address if "://" in address else f"http://{address}"


# ------------------------------------------------------------------------------- a joined cluster


def local_addresses() -> set[str]:
    """Every address of this machine's interfaces, and what its hostname resolves to."""
    out = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    try:
        out.update(str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        pass
    return out


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def all_nodes_local(node_ips: Iterable[str], local: set[str]) -> bool:
    return all(ip in local or _is_loopback(ip) for ip in node_ips)


def cluster_problems(settings: Settings, node_ips: Iterable[str], local: set[str]) -> list[str]:
    """Why this cluster's other machines could not do their part; [] when every node is this machine."""
    ips = sorted(set(node_ips))
    if all_nodes_local(ips, local):
        return []
    remote = ", ".join(ip for ip in ips if ip not in local and not _is_loopback(ip))
    problems = []
    host = urlsplit(settings.redis_url or "").hostname or ""
    if not settings.redis_url or _is_loopback(host):
        problems.append(
            f"Redis at {settings.redis_url or '(embedded)'} is on this machine's loopback, which the nodes "
            f"{remote} cannot reach: pass --redis-url (or REDIS_URL) with an address every node can reach"
        )
    if settings.artifacts.startswith("file://"):
        problems.append(
            f"the artifact store {settings.artifacts} is a local directory the nodes {remote} do not share: "
            "set HITL_ARTIFACTS to a store every node can reach (s3://bucket/prefix, …)"
        )
    if not settings.tokens:
        problems.append(
            "the local api-token file lives on this machine only: set HITL_TOKENS (name:role:token,…) "
            "so replicas on the other nodes know the tokens"
        )
    return problems


def sqlite_archive(settings: Settings) -> str | None:
    """The SQLite archive these settings write (``archive_url``, else ``HITL_ARCHIVE_URL``, else
    ``<data_dir>/archive.sqlite3``); None when archiving is off or the archive is another database."""
    if not settings.archive:
        return None
    from hitl_review.archive.db import archive_url

    url = archive_url(settings.data_dir, settings.archive_url)
    return url if url.startswith("sqlite") else None


def archive_problems(settings: Settings, node_ips: Iterable[str], local: set[str]) -> list[str]:
    """Why the archive cannot be shared by replicas on these nodes; [] when every node is this machine.

    A SQLite archive is one file: the Archiver writes it and the Api replicas read it, wherever Serve
    placed them. On nodes of other machines it would be a file on a network volume, where SQLite's
    locks and WAL (shared memory) are unsafe, or a different file on each node."""
    ips = sorted(set(node_ips))
    sqlite = sqlite_archive(settings)
    if sqlite is None or all_nodes_local(ips, local):
        return []
    remote = ", ".join(ip for ip in ips if ip not in local and not _is_loopback(ip))
    return [
        f"the archive {sqlite} is a SQLite file, which replicas on the nodes {remote} cannot share "
        "(SQLite is unsafe on a network filesystem): set archive_url (HITL_ARCHIVE_URL) to a PostgreSQL "
        "every node can reach (postgresql://user@host/db), or turn archiving off"
    ]


def alive_node_ips() -> list[str] | None:
    """The addresses of the Ray cluster this process is connected to; None when it is connected to none."""
    import ray

    if not ray.is_initialized():
        return None
    return [str(n["NodeManagerAddress"]) for n in ray.nodes() if n.get("Alive")]


def shared_archive_problem(settings: Settings) -> str | None:
    """For a Serve application being built: why its archive cannot serve the cluster the builder
    runs in (``serve deploy``, KubeRay: the build runs on the cluster), or None. Not connected to a
    cluster (``serve run`` and ``serve build`` validate first), nothing to say."""
    if sqlite_archive(settings) is None:
        return None
    ips = alive_node_ips()
    if ips is None:
        return None
    problems = archive_problems(settings, ips, local_addresses())
    return problems[0] if problems else None


def check_joined_cluster(settings: Settings) -> None:
    """Refuse, with every reason at once, a setting the other nodes of the cluster could not use."""
    ips = alive_node_ips() or []
    local = local_addresses()
    problems = cluster_problems(settings, ips, local) + archive_problems(settings, ips, local)
    if problems:
        raise SystemExit("hitl up: cannot join this cluster as configured:\n  - " + "\n  - ".join(problems))
    log.info("joined a Ray cluster of %d node(s) at %s: %s", len(ips), settings.ray_address, ", ".join(sorted(ips)))


def cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0))


def ingress_url(settings: Settings, ingress: str = "proxy") -> str:
    """Where the API really listens. Direct ingress: --host/--api-port, by construction. Proxy: on
    a joined cluster whose Serve was already running, its own HTTP options, not --host/--api-port."""
    asked = f"http://{settings.host}:{settings.api_port}"
    if ingress == "direct":
        return asked
    try:
        # The controller's instance details (what `serve status` and the dashboard read).
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        if client is None:
            raise RuntimeError("Serve is not running")
        details = client.get_serve_details()
    except Exception as e:  # no controller answer: what we asked for is the best guess
        log.warning("could not read Serve's HTTP options (%s); assuming %s", e, asked)
        return asked
    http = details.get("http_options") or {}
    host, port = str(http.get("host") or settings.host), int(http.get("port") or settings.api_port)
    if host in ("0.0.0.0", "::", ""):
        local = local_addresses()
        ips = [str(p.get("node_ip")) for p in (details.get("proxies") or {}).values() if p.get("node_ip")]
        host = next((ip for ip in ips if ip in local), ips[0] if ips else "127.0.0.1")
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    if url != asked:
        log.warning("Serve was already running on this cluster: the API is at %s (--host/--api-port not applied)", url)
    return url
