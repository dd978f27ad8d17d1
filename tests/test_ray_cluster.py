"""`hitl up --ray-address` joins an existing multi-node Ray cluster for real.

The cluster is Ray's own CLI on this machine (``harness.ray_cluster``): a head without GPUs and a
second node with two logical GPUs (no CUDA), its own temp dir, token authentication on. Redis is
an external 3-master Redis Cluster (``redis+cluster://``). Another Serve application is deployed
first; then ``hitl up --ray-address`` joins: the model replicas that ask for GPUs land on the GPU
node (Ray's state API says where each replica actor runs), a job goes submit → WAITING →
intervention → SUCCEEDED through the proxy that was already there, ``serve status`` shows the app
healthy, and stopping ``hitl up`` deletes only its own application: the other one still answers.

The checks of a joined cluster's settings that need no Ray (loopback Redis, ``file://`` artifacts,
the local token file, node addresses) and the dashboard port and READY line run without a cluster.
"""

from __future__ import annotations

import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harness.ci import require_binary
from harness.hitl_up import HitlUp
from harness.ray_cluster import RayCluster, ray_cli
from harness.redis import RedisCluster
from harness.tokens import TOKENS_SPEC
from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.ops.launcher import ready_line
from hitl_review.serve_app.ops.ports import free_port
from hitl_review.serve_app.serving import ray_runtime
from tests.api_util import blank_with_product, intervene, keep_all, submit, wait_done, wait_status

OTHER_APP = """
from ray import serve

@serve.deployment(ray_actor_options={"num_cpus": 0})
class Other:
    def __call__(self, request):
        return "other app"

serve.start(http_options={"host": "127.0.0.1", "port": PORT})
serve.run(Other.bind(), name="other", route_prefix="/other")
result = True
"""

PLACEMENT = """
from ray.util.state import list_actors

gpu_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) > 0]
actors = list_actors(address="DASHBOARD", filters=[("state", "=", "ALIVE")], limit=10000)
result = {
    "gpu_nodes": gpu_nodes,
    "replicas": [[a.class_name, a.node_id] for a in actors if a.class_name.startswith("ServeReplica:")],
}
"""

CONFIG = {
    "deployments": {
        "Detector": {"num_replicas": 1, "ray_actor_options": {"num_gpus": 0.5}},
        "Segmenter": {"num_replicas": 1, "ray_actor_options": {"num_gpus": 0.5}},
        "BoxValidator": {"num_replicas": 1},
    }
}


def serve_status(cluster: RayCluster) -> dict[str, Any]:
    out = subprocess.run(
        [ray_cli("serve"), "status", "-a", cluster.dashboard_url],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    status: dict[str, Any] = yaml.safe_load(out.stdout)
    return status


@pytest.mark.ray_cluster
@pytest.mark.slow
def test_hitl_up_joins_a_two_node_cluster_and_leaves_only_its_app(tmp_path: Path):
    require_binary("redis-server")
    require_binary("redis-cli")
    times: dict[str, float] = {}
    t0 = time.monotonic()
    redis = RedisCluster(tmp_path / "redis").start()
    cluster = RayCluster(log_dir=tmp_path / "ray")
    up: HitlUp | None = None
    try:
        cluster.start()
        cluster.add_node(num_cpus=4, num_gpus=2)
        times["cluster"] = time.monotonic() - t0
        proxy_port = free_port()
        cluster.driver(OTHER_APP.replace("PORT", str(proxy_port)))
        other = httpx.get(f"http://127.0.0.1:{proxy_port}/other", timeout=30)
        assert other.status_code == 200 and other.text == "other app"
        times["other app"] = time.monotonic() - t0

        config = tmp_path / "cluster.yaml"
        config.write_text(yaml.safe_dump(CONFIG))
        t1 = time.monotonic()
        up = HitlUp(
            tmp_path / "data",
            "--ray-address",
            cluster.address,
            "--redis-url",
            redis.url,
            "--config",
            str(config),
            env={**cluster.client_env, "HITL_TOKENS": TOKENS_SPEC},
            log_path=tmp_path / "hitl-up.log",
        ).start(timeout=400)
        times["hitl up"] = time.monotonic() - t1
        # Serve already ran with its proxy on proxy_port: that is where the API is, not --api-port.
        assert up.api_url == f"http://127.0.0.1:{proxy_port}", up.ready

        placement = cluster.driver(PLACEMENT.replace("DASHBOARD", cluster.dashboard_url))
        replicas = {name.split(":")[-1]: node for name, node in placement["replicas"] if ":hitl:" in name}
        assert {"Detector", "Segmenter", "BoxValidator", "Api", "Events"} <= set(replicas), placement
        gpu_nodes = set(placement["gpu_nodes"])
        assert len(gpu_nodes) == 1
        assert replicas["Detector"] in gpu_nodes and replicas["Segmenter"] in gpu_nodes, placement
        assert replicas["BoxValidator"] not in gpu_nodes, "a replica without num_gpus took the GPU node's CPUs?"

        t2 = time.monotonic()
        with httpx.Client(base_url=up.api_url, timeout=60) as c:
            r = submit(c, blank_with_product(seed=11))
            assert r.status_code == 202, r.text
            job = r.json()["job_id"]
            snap = wait_status(c, job, {"WAITING_USER_SELECTION"}, timeout=120)
            assert snap["box_list"], snap
            r = intervene(c, job, snap, keep_all(snap))
            assert r.status_code == 200, r.text
            done = wait_done(c, job, timeout=120)
            assert done["status"] == "SUCCEEDED", done
        times["job"] = time.monotonic() - t2

        status = serve_status(cluster)
        apps = status["applications"]
        assert apps["hitl"]["status"] == "RUNNING", apps["hitl"]
        assert all(d["status"] == "HEALTHY" for d in apps["hitl"]["deployments"].values()), apps["hitl"]
        assert apps["other"]["status"] == "RUNNING"

        t3 = time.monotonic()
        assert up.stop(timeout=60) == 0, up.child.tail(30)
        times["hitl up stop"] = time.monotonic() - t3
        after = serve_status(cluster)["applications"]
        assert "hitl" not in after, after
        assert after["other"]["status"] == "RUNNING", after
        other = httpx.get(f"http://127.0.0.1:{proxy_port}/other", timeout=30)
        assert other.status_code == 200 and other.text == "other app"
        assert len(cluster.leftovers()) > 0, "the cluster itself must still be running"
    finally:
        if up is not None:
            up.kill()
        t4 = time.monotonic()
        cluster.stop()
        times["cluster stop"] = time.monotonic() - t4
        redis.stop()
        times["total"] = time.monotonic() - t0
        print("\n[ray-cluster] " + ", ".join(f"{k} {v:.1f}s" for k, v in times.items()))
    assert cluster.leftovers() == []


# ----------------------------------------------------------------------- no cluster needed

LOCAL = {"127.0.0.1", "10.0.0.7", "::1"}


def _settings(**kw: Any) -> Settings:
    return Settings(data_dir=Path("/srv/hitl"), **kw)


def test_every_node_on_this_machine_accepts_loopback_redis_and_local_files():
    s = _settings(redis_url="redis://127.0.0.1:6379/0")
    assert ray_runtime.cluster_problems(s, ["10.0.0.7", "127.0.0.1"], LOCAL) == []


def test_another_machine_refuses_loopback_redis_file_artifacts_and_the_local_token():
    s = _settings(redis_url="redis+cluster://127.0.0.1:7000/0")
    problems = ray_runtime.cluster_problems(s, ["10.0.0.7", "10.0.0.8"], LOCAL)
    assert len(problems) == 3, problems
    assert "loopback" in problems[0] and "10.0.0.8" in problems[0] and "--redis-url" in problems[0]
    assert "file://" in problems[1] and "HITL_ARTIFACTS" in problems[1]
    assert "HITL_TOKENS" in problems[2]
    assert "(embedded)" in ray_runtime.cluster_problems(_settings(), ["10.0.0.8"], LOCAL)[0]


def test_another_machine_accepts_reachable_redis_shared_artifacts_and_tokens():
    s = _settings(redis_url="redis://10.0.0.5:6379/0", artifacts_root="s3://bucket/hitl", tokens="a:admin:t")
    assert ray_runtime.cluster_problems(s, ["10.0.0.7", "10.0.0.8"], LOCAL) == []
    s = _settings(redis_url="redis://localhost:6379/0", artifacts_root="s3://b/h", tokens="a:admin:t")
    assert len(ray_runtime.cluster_problems(s, ["10.0.0.8"], LOCAL)) == 1


def test_this_machines_addresses_include_loopback():
    assert "127.0.0.1" in ray_runtime.local_addresses()


def test_dashboard_port_a_given_busy_port_is_refused_and_none_is_left_to_ray():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(SystemExit, match=f"--dashboard-port {busy} is in use"):
            ray_runtime.dashboard_port(busy, "127.0.0.1")
    assert ray_runtime.dashboard_port(0, "127.0.0.1") > 0
    assert ray_runtime.dashboard_port(None, "127.0.0.1") is None  # 8265 or the next free: Ray binds it


def test_ready_line():
    assert (
        ready_line("http://a:1", "http://a:2", "http://a:3")
        == "READY api=http://a:1 ui=http://a:2 dashboard=http://a:3"
    )
    assert ready_line("http://a:1", None, "http://a:3") == "READY api=http://a:1 dashboard=http://a:3"
    assert ready_line("http://a:1", None, None) == "READY api=http://a:1"


def test_runtime_env_ships_the_replicas_packages(tmp_path: Path):
    """The one py_module is the hitl_review package; packed as Ray packs a py_module (its zip, which
    the nodes unpack), it holds the replicas' packages' files, the links in a checkout followed."""
    from ray._private.runtime_env.packaging import _zip_files  # create_package packs a py_module with it

    env = ray_runtime.runtime_env()
    [package] = env["py_modules"]
    assert Path(package).name == "hitl_review" and "__pycache__" in env["excludes"]
    out = tmp_path / "pkg.zip"
    _zip_files(package, env["excludes"], str(out), include_gitignore=False, include_parent_dir=True)
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
    for name in ray_runtime.REPLICA_PACKAGES:
        assert f"hitl_review/{name}/__init__.py" in names, sorted(names)[:20]
    assert "hitl_review/statecore/lua/consume_pause.lua" in names
    assert not any("__pycache__" in n for n in names)
