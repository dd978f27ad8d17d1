"""A multi-node Ray cluster on this machine, made with Ray's own CLI: ``ray start --head --block`` and
``ray start --address … --block`` for each further node, every port chosen free on loopback, one
``--temp-dir`` of its own for the cluster (short: Ray's unix sockets live under it). Further nodes
may declare logical GPUs (``num_gpus``): no CUDA is needed for Ray to place ``num_gpus`` actors there.
Ray's token authentication is on, with a token of the cluster's own: ``env`` (``RAY_AUTH_MODE``,
``RAY_AUTH_TOKEN``: ``client_env``) is what every process that talks to it needs, ``auth`` the
dashboard's header.

Stopping is SIGTERM to each ``ray start --block`` (it stops what it started), then SIGKILL to any
process left whose command line names the temp dir; never a global ``ray stop``, which would end
other people's clusters on the machine.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from hitl_review.serve_app.ops.ports import quiet_port

from .proc import Child

BIN = Path(sys.executable).parent
FOREIGN_ENV = ("RAY_ADDRESS",)
STARTED = re.compile(r"Ray runtime started|--block")


def ray_cli(name: str) -> str:
    """``ray`` or ``serve`` from this interpreter's environment."""
    path = BIN / name
    return str(path) if path.exists() else name


def _node_ports(port: Any) -> list[str]:
    """Every port a node opens, free on loopback (the defaults would collide between nodes); ``port``
    gives a free port no other component of the cluster was given."""
    flags = (
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
    )
    out: list[str] = []
    for flag in flags:
        out += [flag, str(port())]
    return out


class RayCluster:
    def __init__(self, *, head_cpus: int = 4, log_dir: Path | None = None) -> None:
        self.temp_dir = Path(tempfile.mkdtemp(prefix="hitl-rc-", dir="/tmp"))
        self.gcs_port = self.port()
        self.dashboard_port = self.port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self.log_dir = log_dir
        self.token = secrets.token_hex(32)
        self.env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
        self.client_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}
        self.env.update(self.client_env)
        self.auth = {"Authorization": f"Bearer {self.token}"}
        self.nodes: list[Child] = []
        self.head_cpus = head_cpus

    def port(self) -> int:
        """A free loopback port not yet handed out in this process."""
        return quiet_port()

    def _start_node(self, args: list[str], name: str, timeout: float) -> Child:
        cmd = [
            ray_cli("ray"),
            "start",
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--disable-usage-stats",
            *args,
            *_node_ports(self.port),
        ]
        log = self.log_dir / f"ray-{name}.log" if self.log_dir else None
        child = Child(cmd, env=self.env, log_path=log).start()
        self.nodes.append(child)
        child.wait_for(STARTED, timeout)
        return child

    def start(self, timeout: float = 180) -> RayCluster:
        try:
            self._start_node(
                [
                    "--head",
                    "--port",
                    str(self.gcs_port),
                    "--temp-dir",
                    str(self.temp_dir),
                    "--num-cpus",
                    str(self.head_cpus),
                    "--num-gpus",
                    "0",
                    "--include-dashboard",
                    "true",
                    "--dashboard-host",
                    "127.0.0.1",
                    "--dashboard-port",
                    str(self.dashboard_port),
                    "--ray-client-server-port",
                    str(self.port()),
                    "--object-store-memory",
                    str(150 * 1024 * 1024),
                ],
                "head",
                timeout,
            )
            self.wait_nodes(1, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, *, num_cpus: int = 4, num_gpus: int = 0, timeout: float = 180) -> None:
        """One more node; it counts once the head sees it alive."""
        want = len(self.nodes) + 1
        self._start_node(
            [
                "--address",
                self.address,
                "--temp-dir",
                str(self.temp_dir),
                "--num-cpus",
                str(num_cpus),
                "--num-gpus",
                str(num_gpus),
                "--object-store-memory",
                str(150 * 1024 * 1024),
            ],
            f"node{len(self.nodes)}",
            timeout,
        )
        self.wait_nodes(want, timeout)

    def driver(self, code: str, timeout: float = 180) -> Any:
        """Run ``code`` in a fresh Python process connected to the cluster (``ray.init(address)``
        done, ``ray`` imported); what it assigns to ``result`` comes back (JSON)."""
        script = (
            "import json, sys, ray\n"
            f"ray.init(address={self.address!r}, log_to_driver=False)\n"
            "result = None\n"
            f"{code}\n"
            "print('RESULT ' + json.dumps(result), flush=True)\n"
        )
        p = subprocess.run(
            [sys.executable, "-c", script], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        for line in p.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])
        raise RuntimeError(f"driver failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")

    def wait_nodes(self, n: int, timeout: float) -> None:
        """Until the dashboard says ``n`` nodes are alive (it is also what the state API reads)."""
        import httpx

        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"{self.dashboard_url}/nodes?view=summary", headers=self.auth, timeout=5)
                if r.status_code == 200:
                    nodes = r.json()["data"]["summary"]
                    last = [x.get("raylet", {}).get("state") for x in nodes]
                    if last.count("ALIVE") >= n:
                        return
                else:
                    last = r.status_code
            except (httpx.HTTPError, ValueError, KeyError) as e:
                last = e
            for node in self.nodes:
                if not node.running:
                    raise RuntimeError(f"{' '.join(node.cmd[:4])} exited:\n{node.tail()}")
            time.sleep(1)
        raise TimeoutError(f"{n} Ray nodes not alive within {timeout:.0f}s (last: {last})")

    def leftovers(self) -> list[psutil.Process]:
        """Processes of this cluster still alive (their command line names its temp dir or GCS port)."""
        marks = (str(self.temp_dir), f"127.0.0.1:{self.gcs_port}")
        out = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                cmdline = p.info["cmdline"] or ()
                if p.pid != os.getpid() and any(m in part for part in cmdline for m in marks):
                    out.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    def stop(self, timeout: float = 5) -> None:
        """SIGTERM every node (a node drains for up to 30 s: cut short, the cluster is thrown away),
        then SIGKILL what is left of it."""
        for node in reversed(self.nodes):
            if node.proc is not None and node.running:
                node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout  # one wait for all the nodes, not one each
        while any(node.running for node in self.nodes) and time.monotonic() < deadline:
            time.sleep(0.1)
        for node in reversed(self.nodes):
            node.stop(0.1)  # SIGKILLs the tree of a node still draining
        left = self.leftovers()
        for p in left:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
