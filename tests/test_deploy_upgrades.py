"""What a KubeRay upgrade touches. A change to ``rayClusterConfig`` (a new image tag) makes KubeRay
start a new RayCluster; the RayService must let that happen on the cluster it describes (one GPU) and
must not let the two clusters, or the cleanup of the old one, reach each other's metadata or the
application's state."""

from __future__ import annotations

from urllib.parse import urlparse

from tests.test_deploy_manifests import (
    ROOT,
    UPGRADE_TYPES,
    manifests,
    pods,
    rayservice,
    secret_env,
    serve_config,
)


def test_gcs_fault_tolerance_has_a_redis_of_its_own():
    """KubeRay's GCS fault tolerance never shares the application's Redis, and pins no key namespace:
    an upgrade's second RayCluster must not read the first one's Serve metadata, and the cleanup Job
    that runs when a RayCluster is deleted removes its whole namespace (Ray's RayService and GCS fault
    tolerance guides; KubeRay's default namespace is each RayCluster's UID)."""
    rs = rayservice()
    cluster = rs["spec"]["rayClusterConfig"]
    gcs = cluster["gcsFaultToleranceOptions"]
    assert "externalStorageNamespace" not in gcs, "pinned: both clusters of an upgrade would share it"
    annotations = {**rs["metadata"].get("annotations", {}), **cluster.get("annotations", {})}
    assert "ray.io/external-storage-namespace" not in annotations
    gcs_url = urlparse(gcs["redisAddress"])
    [app] = serve_config()["applications"]
    app_urls = [urlparse(app["args"]["redis_url"])]
    app_urls += [  # HITL_REDIS_URL / REDIS_URL, where a pod sets it
        urlparse(e["value"])
        for pod in pods(rs)
        for c in pod["containers"]
        for e in c.get("env", [])
        if e["name"] in ("HITL_REDIS_URL", "REDIS_URL") and "value" in e
    ]
    app_redis, gcs_redis = manifests("redis.yaml"), manifests("gcs-redis.yaml")
    for url in app_urls:
        assert url.hostname == app_redis["Service"]["metadata"]["name"]
        assert url.hostname != gcs_url.hostname, "GCS fault tolerance in the application's Redis"
    service, sts = gcs_redis["Service"], gcs_redis["StatefulSet"]
    assert gcs_url.hostname == service["metadata"]["name"] == sts["spec"]["serviceName"]
    assert gcs_url.hostname != app_redis["Service"]["metadata"]["name"]
    [port] = service["spec"]["ports"]
    assert (gcs_url.port or 6379) == port["port"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert not app_redis["Service"]["spec"]["selector"].items() <= labels.items()  # different pods
    [container] = sts["spec"]["template"]["spec"]["containers"]
    flags = dict(zip(container["args"][::2], container["args"][1::2], strict=True))
    assert flags["--maxmemory-policy"] == "noeviction"  # an evicted key: a lost actor or application
    # Its own password: the Secret the RayService hands KubeRay is the one this Redis requires.
    ref = gcs["redisPassword"]["valueFrom"]["secretKeyRef"]
    assert secret_env(container)["REDIS_PASSWORD"] == (ref["name"], ref["key"])
    assert secret_env(container)["REDISCLI_AUTH"] == (ref["name"], ref["key"])
    app_secrets = set(secret_env(app_redis["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]).values())
    assert (ref["name"], ref["key"]) not in app_secrets
    # Only the Ray pods reach it (the head; KubeRay's cleanup Job copies the head's labels).
    [rule] = gcs_redis["NetworkPolicy"]["spec"]["ingress"]
    [source] = rule["from"]
    allowed = dict(source["podSelector"]["matchLabels"])
    assert allowed.pop("ray.io/is-ray-node") == "yes"
    assert allowed.items() <= cluster["headGroupSpec"]["template"]["metadata"]["labels"].items()


def test_an_upgrade_needs_no_gpu_the_cluster_cannot_have():
    """Unset, KubeRay upgrades a changed rayClusterConfig with NewCluster: a second RayCluster as big as
    the first, its GPU worker included. The shipped GPU group is capped at one worker, so that upgrade
    would wait forever for a second GPU: the strategy is set, to one that needs none, and the docs say
    what an upgrade does."""
    rs = rayservice()
    strategy = rs["spec"].get("upgradeStrategy")
    assert strategy and strategy.get("type") in UPGRADE_TYPES, "set spec.upgradeStrategy.type explicitly"
    gpu_groups = [
        g
        for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        if any("nvidia.com/gpu" in c["resources"].get("limits", {}) for c in g["template"]["spec"]["containers"])
    ]
    capped = all(g["maxReplicas"] == g["minReplicas"] for g in gpu_groups)
    if capped:  # no room for the new cluster's GPU workers beside the old ones
        assert strategy["type"] == "None"
    if strategy["type"] == "NewClusterWithIncrementalUpgrade":  # KubeRay refuses it without these
        assert rs["spec"]["rayClusterConfig"].get("enableInTreeAutoscaling") and strategy.get("clusterUpgradeOptions")
    scaling = (ROOT / "docs" / "scaling.md").read_text()
    section = scaling[scaling.index("### Upgrading the RayService") :]
    assert f"`upgradeStrategy: {{type: {strategy['type']}}}`" in section
    assert "NewCluster" in section and "GPU" in section
