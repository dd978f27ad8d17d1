"""The deployment files stay honest: ``deploy/serve-config.yaml`` is what the application builder
makes from its own ``args`` (same deployments, same options) and a valid Ray Serve config;
``deploy/kuberay/rayservice.yaml`` validates against the RayService CRD's openAPIV3Schema (the copy
in ``deploy/kuberay/schema/``, unknown fields refused as ``kubectl apply --validate=strict`` does),
embeds exactly that Serve config, and points at what the other manifests of ``deploy/kuberay/``
provide (Redis with a password and a NetworkPolicy, GCS fault tolerance's own Redis, PostgreSQL and
its migration Job, the volumes, the reviewer UI, the Prometheus Operator objects). Every manifest
there validates offline against Kubernetes' own schemas (kubernetes-validate, strict) or its CRD's
(the copies in ``deploy/kuberay/schema/``): a misspelt field fails here, not in a rollout.

Also the application's own guards on that path (no launcher runs under ``serve run``/``serve
deploy``): typed builder arguments, an API replica that refuses a Redis that could lose state and
fails its health check when its loops died, and no SQLite archive shared across machines.

No Ray cluster here: building an application (``.bind()``, Serve's ``build_app``) needs none.
``tests/test_serve_cli.py`` runs the same files through Ray's CLI."""

from __future__ import annotations

import asyncio
import copy
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import pytest
import ray
import redis
import yaml
from pydantic import ValidationError
from ray._common.utils import import_attr
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve._private.build_app import build_app
from ray.serve.schema import DeploymentSchema, ServeDeploySchema

from harness.ci import require_binary
from hitl_review.serve_app.application import ENV_FALLBACK, Api, AppArgs, refuse_volatile_redis
from hitl_review.serve_app.ops.config import Settings
from hitl_review.serve_app.ops.ports import free_port
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.serve_app.serving import ray_runtime

ROOT = Path(__file__).resolve().parent.parent
SERVE_CONFIG = ROOT / "deploy" / "serve-config.yaml"
KUBERAY = ROOT / "deploy" / "kuberay"
CRD = KUBERAY / "schema" / "ray.io_rayservices.yaml"
MODEL_DEPLOYMENTS = ("Detector", "BoxValidator", "Segmenter")


@pytest.fixture(autouse=True)
def no_env_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builder reads HITL_REDIS_URL & co. when an argument is missing: not from this shell."""
    for names in ENV_FALLBACK.values():
        for name in names:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("HITL_APP_ARGS", raising=False)
    monkeypatch.delenv("HITL_ARCHIVE_URL", raising=False)


@pytest.fixture
def node_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a node of the cluster has in its environment (a Secret on KubeRay)."""
    monkeypatch.setenv("HITL_TOKENS", "ops:admin:test-token")


def load(path: Path) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the 1 MB CRD in 1 s, not 8
    return yaml.load(path.read_text(), Loader=loader)  # a safe loader, chosen above


def serve_config() -> dict[str, Any]:
    return load(SERVE_CONFIG)


def built_deployments(import_path: str, args: dict[str, Any], name: str = "hitl") -> dict[str, dict[str, Any]]:
    """What ``serve deploy`` would run: the builder called by Serve's own code with ``args``, each
    deployment as Serve's config schema writes it (``serve build`` does the same)."""
    from ray.serve.scripts import deployment_to_schema

    app = call_user_app_builder_with_args_if_necessary(import_attr(import_path), args)
    return {
        d.name: deployment_to_schema(d).model_dump(exclude_unset=True) for d in build_app(app, name=name).deployments
    }


def as_written(deployment: dict[str, Any]) -> dict[str, Any]:
    """A config file's deployment entry normalised through Serve's schema (2 and 2.0 compare equal)."""
    return DeploymentSchema.model_validate(deployment).model_dump(exclude_unset=True)


def test_serve_config_is_what_the_builder_makes(node_tokens):
    t0 = time.monotonic()
    config = serve_config()
    ServeDeploySchema.model_validate(config)
    [app] = config["applications"]
    assert app["import_path"] == "hitl_review.serve_app.application:build_app"
    written = {d["name"]: as_written(d) for d in app["deployments"]}
    built = built_deployments(app["import_path"], app["args"])
    assert sorted(written) == sorted(built) == sorted(["Api", "Archiver", "Events", *MODEL_DEPLOYMENTS])
    for name in built:
        assert written[name] == built[name], f"deploy/serve-config.yaml's {name} is not what the builder makes"
    # What the file must state for each deployment (docs/scaling.md § Deploying on an existing Ray
    # cluster / KubeRay), not merely match the builder.
    for name, d in written.items():
        assert d["max_ongoing_requests"] >= 1
        assert {"health_check_period_s", "health_check_timeout_s", "graceful_shutdown_timeout_s"} <= set(d)
        assert "ray_actor_options" in d
        if name in MODEL_DEPLOYMENTS:
            assert d["autoscaling_config"]["min_replicas"] >= 1
            assert d["ray_actor_options"]["num_gpus"] > 0
        else:  # open SSE streams are ongoing requests: a fixed count, never autoscaled on them
            assert "autoscaling_config" not in d and d["num_replicas"] >= 1
    print(f"builder vs serve-config.yaml: {time.monotonic() - t0:.2f}s")


def test_a_drifted_serve_config_is_caught(node_tokens):
    """The comparison above can fail: change one option in the args and the deployments differ."""
    [app] = serve_config()["applications"]
    args = copy.deepcopy(app["args"])
    args["models"]["deployments"]["Segmenter"]["max_replicas"] = 3
    built = built_deployments(app["import_path"], args)
    written = {d["name"]: as_written(d) for d in app["deployments"]}
    assert built["Segmenter"] != written["Segmenter"]
    assert built["Detector"] == written["Detector"]


def test_builder_args_are_validated_by_serve_into_the_typed_model():
    build = import_attr("hitl_review.serve_app.application:build_app")
    # Serve converts the mapping (CLI arguments are strings) into the annotated pydantic model.
    app = call_user_app_builder_with_args_if_necessary(
        build, {"redis_url": "redis://r:6379/0", "api_replicas": "3", "detector_delay_ms": "40"}
    )
    api = {d.name: d for d in build_app(app, name="x").deployments}["Api"]
    assert api.num_replicas == 3
    with pytest.raises(ValidationError, match="no Redis"):
        call_user_app_builder_with_args_if_necessary(build, {})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        call_user_app_builder_with_args_if_necessary(build, {"redis_url": "redis://r", "detektor": "sam"})
    with pytest.raises(ValidationError, match="api_port is not an application argument"):
        call_user_app_builder_with_args_if_necessary(build, {"redis_url": "redis://r", "api_port": "9000"})
    with pytest.raises(ValidationError, match="HITL_TOKENS"):
        call_user_app_builder_with_args_if_necessary(build, {"redis_url": "redis://r", "host": "0.0.0.0"})


def test_env_fallback_and_app_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("HITL_REDIS_URL", "redis://from-env:6380/2")
    monkeypatch.setenv("HITL_ARTIFACTS", f"file://{tmp_path}/a")
    monkeypatch.setenv("HITL_APP_ARGS", '{"api_replicas": 2}')
    args = AppArgs.from_environment()
    assert (args.redis_url, args.artifacts, args.api_replicas) == ("redis://from-env:6380/2", f"file://{tmp_path}/a", 2)
    assert AppArgs.model_validate({"redis_url": "redis://given"}).redis_url == "redis://given"  # args win
    app = import_attr("hitl_review.serve_app.application:app")
    assert {d.name for d in build_app(app, name="x").deployments} == {"Api", "Archiver", "Events", *MODEL_DEPLOYMENTS}
    monkeypatch.setenv("HITL_APP_ARGS", "[1]")
    with pytest.raises(ValueError, match="HITL_APP_ARGS must be a JSON object"):
        AppArgs.from_environment()


async def test_api_replica_refuses_a_redis_that_could_lose_state(tmp_path: Path):
    """What `hitl up --redis-url` refuses, the replica refuses when Serve's CLI deployed it."""
    require_binary("redis-server")
    server = RedisServer(tmp_path / "redis").start()
    r = redis.Redis(port=server.port)
    try:
        settings = Settings(redis_url=server.url)
        await refuse_volatile_redis(settings)  # AOF on, no maxmemory: fine
        r.config_set("maxmemory", "100mb")
        r.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(RuntimeError, match="could be evicted"):
            await refuse_volatile_redis(settings)
        r.config_set("maxmemory-policy", "noeviction")
        await refuse_volatile_redis(settings)
        # (Turning AOF off last: turning it back on would start a rewrite that slows the shutdown.)
        r.config_set("appendonly", "no")
        r.config_set("save", "")
        with pytest.raises(RuntimeError, match="persistence is off"):
            await refuse_volatile_redis(settings)
        await refuse_volatile_redis(settings.model_copy(update={"allow_volatile_redis": True}))  # warns only
    finally:
        r.close()
        server.stop()
    # A Redis that does not answer is the store's business (503 STORE_UNAVAILABLE), not this check's.
    await refuse_volatile_redis(Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", store_timeout_s=1))


async def test_api_replica_health_check_fails_when_a_background_loop_died():
    """Serve calls ``check_health``: a replica whose dispatcher (the inspector's sweeps run in it) or
    archive loop ended would otherwise stay HEALTHY and never take work from the outbox again."""
    # The class as written, not Serve's ingress wrapper around it (whose __init__ builds the ASGI app).
    [cls] = [c for c in Api.func_or_class.__mro__[1:] if c.__module__ == "hitl_review.serve_app.application"]
    api = cls(Settings(redis_url="redis://r:6379/0").model_dump_json(), None, None, None, None)
    await api.check_health()  # before the lifespan started any loop: healthy

    async def crashes() -> None:
        raise ValueError("dispatcher crashed")

    alive = asyncio.create_task(asyncio.sleep(3600), name="archive loop")
    dead = asyncio.create_task(crashes(), name="dispatcher")
    await asyncio.gather(dead, return_exceptions=True)
    try:
        api.background = [alive]
        await api.check_health()
        api.background = [dead, alive]
        with pytest.raises(RuntimeError, match="dispatcher.*dispatcher crashed"):
            await api.check_health()
        alive.cancel()
        await asyncio.gather(alive, return_exceptions=True)
        api.background = [alive]  # cancelled (not by a stop: Serve stops asking then) is dead too
        with pytest.raises(RuntimeError, match="archive loop"):
            await api.check_health()
    finally:
        alive.cancel()


def test_a_sqlite_archive_is_refused_across_machines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """As loopback Redis and file:// artifacts are: one machine may share a SQLite file, several may not
    (SQLite's locks and WAL on a network volume). ``hitl up --ray-address`` checks the joined cluster's
    nodes; the builder, the cluster it runs in (serve deploy, KubeRay)."""
    local = {"127.0.0.1", "10.0.0.7"}
    sqlite = Settings(data_dir=tmp_path)
    assert ray_runtime.archive_problems(sqlite, ["10.0.0.7", "127.0.0.1"], local) == []
    [problem] = ray_runtime.archive_problems(sqlite, ["10.0.0.7", "10.0.0.8"], local)
    assert "SQLite" in problem and "10.0.0.8" in problem and "archive_url" in problem and str(tmp_path) in problem
    postgres = Settings(data_dir=tmp_path, archive_url="postgresql://hitl@db:5432/hitl")
    assert ray_runtime.archive_problems(postgres, ["10.0.0.8"], local) == []
    assert ray_runtime.archive_problems(Settings(archive=False), ["10.0.0.8"], local) == []
    monkeypatch.setenv("HITL_ARCHIVE_URL", "postgresql://hitl@db:5432/hitl")  # where replicas also read it
    assert ray_runtime.archive_problems(sqlite, ["10.0.0.8"], local) == []
    monkeypatch.delenv("HITL_ARCHIVE_URL")
    # Not connected to a cluster (serve run, serve build validate first): nothing to refuse yet.
    assert not ray.is_initialized()
    assert ray_runtime.shared_archive_problem(sqlite) is None
    AppArgs.model_validate({"redis_url": "redis://r", "data_dir": str(tmp_path)})


def test_builder_arguments_take_secrets_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    """``${NAME}`` in redis_url / archive_url: the config names the Secret, the building pod has it."""
    url = "redis://:${HITL_REDIS_PASSWORD}@hitl-redis:6379/0"
    assert AppArgs.model_validate({"redis_url": url}).redis_url == url  # not set: left as written
    monkeypatch.setenv("HITL_REDIS_PASSWORD", "s3cret")
    args = AppArgs.model_validate({"redis_url": url, "archive_url": "postgresql://u:${HITL_REDIS_PASSWORD}@db/h"})
    assert (args.redis_url, args.archive_url) == ("redis://:s3cret@hitl-redis:6379/0", "postgresql://u:s3cret@db/h")
    assert args.settings().redis_url == "redis://:s3cret@hitl-redis:6379/0"  # what the replicas get


# ---------------------------------------------------------------------------- KubeRay


def strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, as the API server's strict field validation does
    (a structural schema otherwise prunes them silently: a typo would deploy without its setting)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


# What KubeRay's controller accepts for spec.upgradeStrategy.type (ray-operator/controllers/ray/utils/
# validation.go); the CRD's schema leaves it a free string.
UPGRADE_TYPES = ("NewCluster", "NewClusterWithIncrementalUpgrade", "None")


@pytest.fixture(scope="module")
def rayservice_validator() -> jsonschema.protocols.Validator:
    crd = load(CRD)
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == "RayService"
    [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert v1["served"] and v1["storage"]
    schema = strict(v1["schema"]["openAPIV3Schema"])
    # The CRD leaves upgradeStrategy.type a free string; KubeRay's controller accepts only these.
    schema["properties"]["spec"]["properties"]["upgradeStrategy"]["properties"]["type"]["enum"] = list(UPGRADE_TYPES)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def rayservice() -> dict[str, Any]:
    return load(KUBERAY / "rayservice.yaml")


def errors(validator: jsonschema.protocols.Validator, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_rayservice_validates_against_the_crd(rayservice_validator):
    rs = rayservice()
    assert (rs["apiVersion"], rs["kind"]) == ("ray.io/v1", "RayService")
    assert errors(rayservice_validator, rs) == []
    # The validation can fail: a misspelt field, a wrong type, a missing required field.
    typo = copy.deepcopy(rs)
    typo["spec"]["rayClusterConfig"]["workerGroupSpec"] = typo["spec"]["rayClusterConfig"].pop("workerGroupSpecs")
    assert any("workerGroupSpec" in e for e in errors(rayservice_validator, typo))
    wrong = copy.deepcopy(rs)
    wrong["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = "one"
    assert errors(rayservice_validator, wrong)
    missing = copy.deepcopy(rs)
    del missing["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert any("template" in e for e in errors(rayservice_validator, missing))
    recreate = copy.deepcopy(rs)  # a RayCluster's upgrade type, which KubeRay refuses on a RayService
    recreate["spec"]["upgradeStrategy"] = {"type": "Recreate"}
    assert any("upgradeStrategy" in e for e in errors(rayservice_validator, recreate))


def manifest_files() -> list[Path]:
    """Every manifest of deploy/kuberay/ (the CRD copies in schema/ are what they are checked against)."""
    files = sorted(KUBERAY.glob("*.yaml"))
    assert {"rayservice.yaml", "redis.yaml", "gcs-redis.yaml", "monitoring.yaml", "ui.yaml"} <= {f.name for f in files}
    return files


def test_rayservice_embeds_the_serve_config():
    rs = rayservice()
    embedded = yaml.safe_load(rs["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(embedded)
    assert embedded == serve_config(), "rayservice.yaml's serveConfigV2 differs from deploy/serve-config.yaml"
    assert rs["spec"]["rayClusterConfig"]["rayVersion"] == ray.__version__


def pods(rs: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = rs["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]


def mounted(pod: dict[str, Any], path: str) -> bool:
    return any(
        path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
        for c in pod["containers"]
        for m in c.get("volumeMounts", [])
    )


def test_rayservice_nodes_have_what_the_application_args_name():
    rs = rayservice()
    [app] = serve_config()["applications"]
    args = AppArgs.model_validate({**app["args"], "tokens": "x:admin:y"})  # tokens: from the Secret
    gpu_groups = [
        g
        for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        if any("nvidia.com/gpu" in c["resources"].get("limits", {}) for c in g["template"]["spec"]["containers"])
    ]
    assert gpu_groups, "the model deployments ask for GPUs: a worker group must have them"
    artifacts = urlparse(args.artifacts)
    assert artifacts.scheme == "file"
    for pod in pods(rs):
        # Any node may run an Api replica (uploads) or a model replica (masks): same paths on all.
        assert mounted(pod, artifacts.path) and mounted(pod, str(args.data_dir))
        # host 0.0.0.0 needs tokens; they come from a Secret, never from the config.
        env = {e["name"]: e for c in pod["containers"] for e in c.get("env", [])}
        assert "secretKeyRef" in env["HITL_TOKENS"]["valueFrom"]
    for group in gpu_groups:
        assert args.sam_checkpoint and mounted(group["template"]["spec"], args.sam_checkpoint)


def manifests(name: str) -> dict[str, dict[str, Any]]:
    """A multi-document manifest of deploy/kuberay/, by kind (one object of each kind per file)."""
    docs = list(yaml.safe_load_all((KUBERAY / name).read_text()))
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), f"{name}: two objects of one kind"
    return by_kind


def secret_env(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """A container's environment variables taken from Secrets: name -> (secret, key)."""
    refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in container.get("env", [])}
    return {name: (ref["name"], ref["key"]) for name, ref in refs.items() if ref}


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (4Gi) or a redis-server size (2gb) in bytes."""
    m = re.fullmatch(r"(\d+)\s*(Ki|Mi|Gi|kb|mb|gb)?", quantity, re.IGNORECASE)
    assert m, quantity
    scale = {"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}
    return int(m[1]) * scale.get((m[2] or "").lower(), 1)


def test_redis_manifest_provides_the_redis_the_config_names():
    by_kind = manifests("redis.yaml")
    assert sorted(by_kind) == ["NetworkPolicy", "Service", "StatefulSet"]
    service, sts, policy = by_kind["Service"], by_kind["StatefulSet"], by_kind["NetworkPolicy"]
    [app] = serve_config()["applications"]
    url = urlparse(app["args"]["redis_url"])
    assert url.scheme == "redis"
    assert url.hostname == service["metadata"]["name"] == sts["spec"]["serviceName"]
    [port] = service["spec"]["ports"]
    assert port["port"] == (url.port or 6379)
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    [container] = sts["spec"]["template"]["spec"]["containers"]
    assert port["targetPort"] in [p[k] for p in container["ports"] for k in ("name", "containerPort")]
    flags = dict(zip(container["args"][::2], container["args"][1::2], strict=True))
    # What `hitl up --redis-url` insists on for an external Redis: persistence on, no eviction.
    assert flags["--appendonly"] == "yes" and flags["--maxmemory-policy"] == "noeviction"
    data_mount = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}[flags["--dir"]]
    assert data_mount in {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    # Room for the AOF rewrite's fork: copy-on-write may double the data set while it runs.
    assert 2 * memory_bytes(flags["--maxmemory"]) <= memory_bytes(container["resources"]["limits"]["memory"])
    # A password from a Secret, put into a config file at start (never in the arguments); the config's
    # URL takes the same Secret from the Ray pods' environment, and the probe's redis-cli authenticates with it.
    env = secret_env(container)
    assert "--requirepass" not in flags
    [var] = re.findall(r'requirepass %s\\n" "\$(\w+)"', " ".join(container["command"]))
    assert env["REDISCLI_AUTH"] == env[var]
    [placeholder] = re.findall(r"\$\{(\w+)\}", url.password or "")
    for pod in pods(rayservice()):
        for c in pod["containers"]:
            assert secret_env(c)[placeholder] == env[var]
    # Only the Ray pods reach it (KubeRay labels them ray.io/is-ray-node; ours add part-of).
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    [rule] = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [6379]
    [source] = rule["from"]
    selected = source["podSelector"]["matchLabels"]
    allowed = dict(selected)
    assert allowed.pop("ray.io/is-ray-node") == "yes"
    cluster = rayservice()["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert allowed.items() <= group["template"]["metadata"]["labels"].items()
    assert not selected.items() <= manifests("ui.yaml")["Deployment"]["spec"]["template"]["metadata"]["labels"].items()


def test_the_archive_is_postgresql_migrated_once_by_a_job():
    """SQLite cannot be shared by replicas on several nodes: the shipped config names the PostgreSQL
    of postgres.yaml, whose password reaches the Ray pods and the migration Job as PGPASSWORD."""
    [app] = serve_config()["applications"]
    url = urlparse(app["args"]["archive_url"])
    assert url.scheme == "postgresql" and not url.password  # the password is never in the config
    pg = manifests("postgres.yaml")
    assert url.hostname == pg["Service"]["metadata"]["name"] == pg["StatefulSet"]["spec"]["serviceName"]
    assert url.port == pg["Service"]["spec"]["ports"][0]["port"]
    [db] = pg["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    plain = {e["name"]: e.get("value") for e in db["env"]}
    assert (plain["POSTGRES_USER"], plain["POSTGRES_DB"]) == (url.username, url.path.lstrip("/"))
    password = secret_env(db)["POSTGRES_PASSWORD"]
    job = manifests("archive-migrate.yaml")["Job"]
    [migrate] = job["spec"]["template"]["spec"]["containers"]
    assert migrate["command"][:3] == ["python", "-m", "hitl_review.archive.migrate"]
    assert migrate["command"][migrate["command"].index("--archive-url") + 1] == app["args"]["archive_url"]
    assert secret_env(migrate)["PGPASSWORD"] == password
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")
    for pod in pods(rayservice()):
        assert all(secret_env(c)["PGPASSWORD"] == password for c in pod["containers"])


def test_the_volumes_the_pods_mount_are_claimed():
    claims = {d["metadata"]["name"]: d for d in yaml.safe_load_all((KUBERAY / "volumes.yaml").read_text())}
    assert {d["kind"] for d in claims.values()} == {"PersistentVolumeClaim"}
    used = {
        v["persistentVolumeClaim"]["claimName"]
        for pod in pods(rayservice())
        for v in pod.get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    assert used == set(claims)
    assert claims["hitl-data"]["spec"]["accessModes"] == ["ReadWriteMany"]  # every node, the same files


def test_monitoring_scrapes_the_pods_and_alerts_as_deploy_prometheus_does():
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all((KUBERAY / "monitoring.yaml").read_text()):
        by_kind.setdefault(doc["kind"], []).append(doc)
    [rule] = by_kind["PrometheusRule"]
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())
    assert rule["spec"]["groups"] == rules["groups"], "regenerate monitoring.yaml from deploy/prometheus/rules.yml"
    cluster = rayservice()["spec"]["rayClusterConfig"]
    groups = {"head": cluster["headGroupSpec"], **{g["groupName"]: g for g in cluster["workerGroupSpecs"]}}
    for monitor in by_kind["PodMonitor"]:
        wanted = dict(monitor["spec"]["selector"]["matchLabels"])
        node_type = {"yes": None, "head": "head"}[
            wanted.pop("ray.io/node-type", None) or wanted.pop("ray.io/is-ray-node")
        ]
        chosen = [g for name, g in groups.items() if node_type in (None, name)]
        for group in chosen:
            template = group["template"]
            assert wanted.items() <= template["metadata"]["labels"].items()
            names = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= names, monitor["metadata"]["name"]


def test_the_reviewer_ui_deploys_with_its_own_image_and_logins():
    by_kind = manifests("ui.yaml")
    deployment, service = by_kind["Deployment"], by_kind["Service"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    # The image's entrypoint (the installed hitl_review.ui), not a command of the pod's own: `python -m
    # ui` ran a second copy of the modules from sources left in the working directory.
    assert "command" not in container
    assert "--require-login" in container["args"]  # each reviewer's own token, none in the pod
    assert not any("TOKEN" in e["name"] for e in container.get("env", []))
    dockerfile = (KUBERAY / "ui.Dockerfile").read_text()
    [tag] = [w for line in dockerfile.splitlines() if "docker build" in line for w in line.split()[1:] if ":" in w]
    assert container["image"] == tag
    api = urlparse({e["name"]: e.get("value") for e in container["env"]}["HITL_API_URL"])
    assert api.hostname == f"{rayservice()['metadata']['name']}-serve-svc"  # KubeRay's Serve service
    assert api.port == serve_config()["http_options"]["port"]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    [port] = service["spec"]["ports"]
    assert port["targetPort"] in [p[k] for p in container["ports"] for k in ("name", "containerPort")]
