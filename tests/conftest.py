"""Fixtures that start the real parts: redis-server (AOF, free port), a 3-master
Redis Cluster, and the statecore Store on top. Never a fake: the Lua is the product.

Locally a missing redis-server skips; under CI it fails the run."""
from __future__ import annotations

import os
import shutil

import pytest
import pytest_asyncio

from serve_app.redis_server import RedisCluster, RedisServer
from statecore.models import ImageRef
from statecore.store import Store, StoreConfig

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(name: str) -> None:
    if shutil.which(name) or os.path.exists(f"/usr/bin/{name}"):
        return
    if IN_CI:
        pytest.fail(f"{name} is required under CI (make setup installs it)")
    pytest.skip(f"{name} not installed")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    require_binary("redis-server")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory):
    require_binary("redis-server")
    require_binary("redis-cli")
    cluster = RedisCluster(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


async def _fresh_store(url: str, cluster: bool) -> Store:
    store = Store.from_url(url, StoreConfig(retention_s=3600, node_timeout_s=60), cluster=cluster)
    if cluster:
        await store.r.flushall()
    else:
        await store.r.flushdb()
    await store.ensure_groups()
    return store


@pytest_asyncio.fixture
async def store(redis_server: RedisServer):
    s = await _fresh_store(redis_server.url, cluster=False)
    yield s
    await s.close()


@pytest_asyncio.fixture
async def cluster_store(redis_cluster: RedisCluster):
    s = await _fresh_store(redis_cluster.url, cluster=True)
    yield s
    await s.close()


@pytest.fixture
def image() -> ImageRef:
    return ImageRef(sha256="a" * 64, width=640, height=480, url="/api/v1/artifacts/img_" + "a" * 16 + ".png")


# ---------------------------------------------------------------------------- control plane (uvicorn)

TOKENS = {
    "admin": "tok-admin", "rev1": "tok-rev1", "rev2": "tok-rev2", "sub1": "tok-sub1", "sub2": "tok-sub2",
    "exec": "tok-exec",
}
TOKENS_SPEC = ("admin:admin:tok-admin,rev1:reviewer:tok-rev1,rev2:reviewer:tok-rev2,"
               "sub1:submitter:tok-sub1,sub2:submitter:tok-sub2,exec:executor:tok-exec")


@pytest.fixture(scope="session")
def api_server(tmp_path_factory: pytest.TempPathFactory):
    """The FastAPI control plane under uvicorn in this process, with a dispatcher running the
    classical backends in threads and its own real redis-server."""
    require_binary("redis-server")
    from tests.harness import LocalServer

    data = tmp_path_factory.mktemp("api")
    redis = RedisServer(data / "redis").start()
    server = LocalServer(data, redis.url, tokens=TOKENS_SPEC, max_upload_bytes=3_000_000).start()
    yield server
    server.stop()
    redis.stop()
