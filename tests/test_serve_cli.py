"""The application the way Ray users deploy it, through Ray's own CLI (docs/scaling.md § Deploying
on an existing Ray cluster / KubeRay): ``serve build`` writes the config of ``deploy/serve-config.yaml``;
``serve run serve_app.application:app`` serves the API and a job reaches its pause; ``serve deploy
deploy/serve-config.yaml`` on a ``ray start --head`` cluster comes up RUNNING with every deployment
HEALTHY, its SAM replicas placed on the cluster's GPU node.

One cluster for the module, shaped like deploy/kuberay/rayservice.yaml's: a head without GPUs and a
node with one (logical) GPU (``harness.ray_cluster``: Ray's CLI, free ports, its own temp dir and
token, stopped by PID), and a redis-server of its own; each test prints its wall time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ray.serve.schema import DeploymentSchema, ServeDeploySchema

from harness.ci import require_binary
from harness.proc import Child
from harness.ray_cluster import RayCluster, ray_cli
from harness.tokens import token_file
from hitl_review.serve_app.ops.ports import quiet_port
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.serve_app.ops.samples import product_composite

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
SERVE_CONFIG = ROOT / "deploy" / "serve-config.yaml"
# What a node of the cluster has in its environment (a Secret on KubeRay): the config's
# `host: 0.0.0.0` requires tokens.
NODE_TOKEN = "ci-admin-token"
NODE_ENV = {"HITL_TOKENS": f"ops:admin:{NODE_TOKEN}"}
# Inherited from the caller's shell they would point the builder elsewhere.
FOREIGN_ENV = ("RAY_ADDRESS", "REDIS_URL", "HITL_REDIS_URL", "HITL_ARTIFACTS", "HITL_TOKENS", "HITL_DATA_DIR")


def cli_env(cluster: RayCluster | None = None, **extra: str) -> dict[str, str]:
    """The CLI's environment; with ``cluster``, its authentication token (a client sends one only
    under RAY_AUTH_MODE=token)."""
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV and k != "HITL_APP_ARGS"}
    env.update(PYTHONUNBUFFERED="1", **(cluster.client_env if cluster else {}), **extra)
    return env


def serve_cli(*args: str, env: Mapping[str, str], timeout: float = 120) -> str:
    """Run ``serve ARGS…`` to completion; its stdout, or a failure with everything it printed."""
    proc = subprocess.run(
        [ray_cli("serve"), *args], env=dict(env), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert proc.returncode == 0, f"serve {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def committed() -> dict[str, Any]:
    return yaml.safe_load(SERVE_CONFIG.read_text())


def deployments_of(app: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: DeploymentSchema.model_validate(d).model_dump(exclude_unset=True) for d in app["deployments"]}


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_binary("redis-server")
    server = RedisServer(tmp_path_factory.mktemp("serve-cli-redis")).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    """A head without GPUs and a node with one logical GPU: the config's model deployments ask for
    GPU fractions, and the application may be built on the head (hence ``gpus: true``)."""
    t0 = time.monotonic()
    cluster = RayCluster(head_cpus=4)
    cluster.env.update(NODE_ENV)  # every Ray process of the cluster has it, as the pods do
    cluster.start()
    try:
        cluster.add_node(num_cpus=4, num_gpus=1)
    except BaseException:
        cluster.stop()
        raise
    print(f"\nray start, head + GPU node: {time.monotonic() - t0:.1f}s ({cluster.address}, {cluster.temp_dir})")
    yield cluster
    t0 = time.monotonic()
    cluster.stop()
    assert cluster.leftovers() == []
    print(f"ray cluster stopped: {time.monotonic() - t0:.1f}s")


def test_serve_build_writes_the_committed_deployments(tmp_path: Path):
    """``serve build`` (Ray 2.60's takes a bound application, so ``:app`` with the config's args in
    HITL_APP_ARGS) writes a valid config whose deployments are those of deploy/serve-config.yaml."""
    t0 = time.monotonic()
    [app] = committed()["applications"]
    out = tmp_path / "built.yaml"
    env = cli_env(HITL_APP_ARGS=json.dumps(app["args"]), **NODE_ENV)
    serve_cli("build", "hitl_review.serve_app.application:app", "-o", str(out), env=env)
    built = yaml.safe_load(out.read_text())
    ServeDeploySchema.model_validate(built)
    [built_app] = built["applications"]
    assert built_app["import_path"] == "hitl_review.serve_app.application:app"
    assert deployments_of(built_app) == deployments_of(app)
    print(f"serve build: {time.monotonic() - t0:.1f}s")


def test_serve_run_builder_arguments_are_typed():
    """``serve run serve_app.application:build_app key=value…``: Serve validates the arguments into
    AppArgs before it connects to any cluster, so a typo or a missing Redis stops it at once."""
    t0 = time.monotonic()
    for args, message in (
        (["redis_url=redis://127.0.0.1:1/0", "detektor=sam"], "detektor"),
        (["detector=classical"], "no Redis: pass redis_url"),
        (["redis_url=redis://127.0.0.1:1/0", "api_replicas=two"], "api_replicas"),
    ):
        proc = subprocess.run(
            [ray_cli("serve"), "run", "hitl_review.serve_app.application:build_app", *args, "--address", "127.0.0.1:1"],
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert proc.returncode != 0 and "ValidationError" in proc.stderr and message in proc.stderr, proc.stderr
    print(f"serve run with bad builder arguments, 3 refusals: {time.monotonic() - t0:.1f}s")


def ready_answer(api: str) -> dict[str, Any]:
    """/readyz's answer when ready; its status and body otherwise, as the error ``wait_until`` keeps."""
    r = httpx.get(f"{api}/readyz", timeout=30)
    if r.status_code != 200:
        raise ValueError(f"{r.status_code} {r.text[:400]}")
    answer: dict[str, Any] = r.json()
    return answer


def wait_until(what: str, probe: Any, timeout: float, child: Child | None = None, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except (httpx.HTTPError, OSError, ValueError) as e:
            last = e
        time.sleep(interval)
    said = f"\n`serve run` said (last lines):\n{child.tail(60)}" if child is not None else ""
    raise AssertionError(f"{what} not within {timeout:.0f}s (last: {last!r}){said}")


@pytest.mark.ray_cluster
@pytest.mark.parametrize("target", ["app", "build_app"])
def test_serve_run_serves_and_a_job_reaches_its_pause(cluster: RayCluster, redis_url: str, tmp_path: Path, target: str):
    """``serve run serve_app.application:app`` with its settings in the environment, and
    ``serve run serve_app.application:build_app key=value…`` with them as builder arguments."""
    t0 = time.monotonic()
    port = quiet_port()
    # Serve's HTTP port for an import path is fixed (8000) unless Serve is already up: start it on a free one.
    serve_cli(
        "start",
        *("--address", cluster.address, "--http-host", "127.0.0.1", "--http-port", str(port)),
        env=cli_env(cluster),
    )
    data_dir = tmp_path / "data"
    settings = {
        "redis_url": redis_url,
        "artifacts_root": f"file://{tmp_path / 'artifacts'}",
        "data_dir": str(data_dir),
        "heartbeat_lapse_s": "10",
    }
    if target == "app":
        env = cli_env(
            cluster,
            HITL_REDIS_URL=settings.pop("redis_url"),
            HITL_ARTIFACTS=settings.pop("artifacts_root"),
            HITL_DATA_DIR=settings.pop("data_dir"),
            HITL_APP_ARGS=json.dumps(settings),
        )
        arguments = []
    else:
        env = cli_env(cluster)
        arguments = [f"{k}={v}" for k, v in settings.items()]
    cmd = [
        ray_cli("serve"),
        "run",
        f"hitl_review.serve_app.application:{target}",
        *arguments,
        "--address",
        cluster.address,
    ]
    run = Child(cmd, env=env)
    run.start()
    api = f"http://127.0.0.1:{port}"
    try:
        wait_until("/healthz", lambda: httpx.get(f"{api}/healthz", timeout=5).status_code == 200, 240, run)
        t_up = time.monotonic() - t0
        # No HITL_TOKENS on loopback: the Api replica wrote the local admin token into the data dir.
        token = wait_until("the local token", lambda: token_file(data_dir), 60)
        headers = {"Authorization": f"Bearer {token}"}
        image, _boxes = product_composite(seed=3)
        r = httpx.post(
            f"{api}/api/v1/jobs", files={"image": ("p.png", image, "image/png")}, headers=headers, timeout=30
        )
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]

        def waiting() -> dict[str, Any] | None:
            snap = httpx.get(f"{api}/api/v1/jobs/{job_id}", headers=headers, timeout=10).json()
            assert snap["status"] not in ("FAILED", "CANCELLED", "TIMED_OUT"), snap
            return snap if snap["status"] == "WAITING_USER_SELECTION" else None

        snap = wait_until("WAITING_USER_SELECTION", waiting, 120)
        assert snap["box_list"] and snap["active_pause"]
        # A readiness probe may say "not yet" on a loaded host (each model deployment asked in 5 s): as a
        # kubelet does, ask again.
        ready = wait_until("/readyz ready", lambda: ready_answer(api), 60, run)
        assert ready["backends"]["detector"] == "classical", ready
    finally:
        if run.proc is not None and run.running:
            run.proc.send_signal(signal.SIGINT)  # what Ctrl-C does: serve run shuts Serve down
            try:
                run.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                run.kill()
        # Serve gone whatever happened above (a serve run killed mid-shutdown leaves its controller, and
        # the next test's `serve start` on another port would find it): the next test starts clean.
        try:
            serve_cli("shutdown", "--address", cluster.dashboard_url, "--yes", env=cli_env(cluster))
        except (AssertionError, subprocess.TimeoutExpired) as e:  # said, not raised: it would hide the result
            print(f"serve shutdown after the test failed: {e}")
    print(f"serve run …:{target}: up in {t_up:.1f}s, job paused, stopped; {time.monotonic() - t0:.1f}s in all")


@pytest.fixture(scope="module")
def tiny_sam_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SAM of the real architecture with random weights, small enough for CPU (as in test_models_sam.py)."""
    import torch

    from hitl_review.deployments.backends.sam import build_sam_vit_tiny

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("sam") / "sam_tiny.pth"
    torch.save(build_sam_vit_tiny().state_dict(), path)
    return str(path)


PLACEMENT = """
from ray.util.state import list_actors

gpu_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) > 0]
actors = list_actors(address="DASHBOARD", filters=[("state", "=", "ALIVE")], limit=10000)
result = {
    "gpu_nodes": gpu_nodes,
    "replicas": [[a.class_name, a.node_id] for a in actors if a.class_name.startswith("ServeReplica:hitl:")],
}
"""


def site_config(redis_url: str, tmp_path: Path, checkpoint: str, port: int) -> dict[str, Any]:
    """deploy/serve-config.yaml with this site's values: Redis, artifact and data paths, the SAM
    checkpoint, the HTTP address. Deployments and every other argument stay as committed."""
    config = committed()
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    config["grpc_options"]["port"] = quiet_port()
    [app] = config["applications"]
    app["args"].update(
        redis_url=redis_url,
        artifacts_root=f"file://{tmp_path / 'artifacts'}",
        data_dir=str(tmp_path / "data"),
        # The committed config names the PostgreSQL of the KubeRay manifests; this cluster is one
        # machine, where a SQLite archive is allowed.
        archive_url=f"sqlite:///{tmp_path / 'data' / 'archive.sqlite3'}",
        sam_checkpoint=checkpoint,
        sam_model_type="vit_tiny",
    )
    return config


@pytest.mark.ray_cluster
def test_serve_deploy_config_runs_healthy(
    cluster: RayCluster, redis_url: str, tiny_sam_checkpoint: str, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    port = quiet_port()
    config = site_config(redis_url, tmp_path, tiny_sam_checkpoint, port)
    path = tmp_path / "serve-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = cli_env(cluster)
    serve_cli("deploy", str(path), "--address", cluster.dashboard_url, env=env)

    def running() -> dict[str, Any] | None:
        status = yaml.safe_load(serve_cli("status", "--address", cluster.dashboard_url, env=env))
        app = (status.get("applications") or {}).get("hitl") or {}
        assert app.get("status") not in ("DEPLOY_FAILED", "UNHEALTHY"), status
        healthy = app.get("status") == "RUNNING" and all(
            d.get("status") == "HEALTHY" for d in app.get("deployments", {}).values()
        )
        return app if healthy else None

    app = wait_until("hitl RUNNING with every deployment HEALTHY", running, 300, interval=2)
    assert sorted(app["deployments"]) == sorted(d["name"] for d in config["applications"][0]["deployments"])
    # The model replicas asked for GPU fractions (gpus: true, built wherever Serve chose): on the GPU node.
    placement = cluster.driver(PLACEMENT.replace("DASHBOARD", cluster.dashboard_url))
    [gpu_node] = placement["gpu_nodes"]
    nodes = {name.split(":")[-1]: node for name, node in placement["replicas"]}
    assert all(nodes[d] == gpu_node for d in ("Detector", "BoxValidator", "Segmenter")), placement
    api = f"http://127.0.0.1:{port}"
    ready = httpx.get(f"{api}/readyz", timeout=30)
    assert ready.status_code == 200, ready.text
    assert ready.json()["backends"] == {"detector": "sam-auto", "validator": "sam", "segmenter": "sam"}
    # host 0.0.0.0: the cluster's HITL_TOKENS, not a local token, guard the API.
    assert httpx.get(f"{api}/api/v1/jobs", timeout=10).status_code == 401
    jobs = httpx.get(f"{api}/api/v1/jobs", headers={"Authorization": f"Bearer {NODE_TOKEN}"}, timeout=10)
    assert jobs.status_code == 200, jobs.text
    print(f"serve deploy: RUNNING/HEALTHY in {time.monotonic() - t0:.1f}s")
    serve_cli("shutdown", "--address", cluster.dashboard_url, "--yes", env=env)
