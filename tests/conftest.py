"""Fixtures that start the real parts: redis-server (AOF, free port), a 3-master Redis Cluster, the
statecore Store on top, and the control plane under uvicorn. Never a fake: the Lua is the product.

Locally a missing redis-server skips; under CI it fails the run (``harness.ci``)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from harness.ci import require_binary
from harness.postgres import PostgresServer, require_postgres
from harness.redis import RedisCluster
from harness.tokens import TOKENS_SPEC
from harness.uvicorn import LocalServer
from hitl_review.archive import migrate
from hitl_review.archive.db import Archive
from hitl_review.serve_app.ops.redis_server import RedisServer
from hitl_review.statecore.models import ImageRef
from hitl_review.statecore.store import Store, StoreConfig
from tests.browser_stack import stop_shared
from tests.browser_util import launched_chromium
from tests.client_fakes import CLIENT_KINDS, ClientFactory, client_factory


@pytest.fixture(autouse=True)
def hitl_logger_restored() -> Iterator[None]:
    """A test that builds a Serve replica in-process configures the ``hitl`` logger for a replica
    (its own stderr handler, no propagation: serve_app.observability.logging_setup.configure_component); put it
    back, so later tests' log capture and files see the lines again."""
    logger = logging.getLogger("hitl")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(scope="module")
def browser(stack: Any) -> Iterator[Any]:
    """Chromium for a browser module, launched once the module's ``stack`` (its ``hitl up``,
    tests/browser_stack.py) is up, and stopped with the module."""
    with launched_chromium() as b:
        yield b


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


@pytest.fixture(scope="session")
def api_server(tmp_path_factory: pytest.TempPathFactory):
    """The FastAPI control plane under uvicorn in this process, with a dispatcher running the
    classical backends in threads and its own real redis-server; the identities of ``harness.tokens``."""
    require_binary("redis-server")
    server = LocalServer(tmp_path_factory.mktemp("api"), tokens=TOKENS_SPEC, max_upload_bytes=3_000_000).start()
    yield server
    server.stop()


# ---------------------------------------------------------------------------- the two clients


@pytest.fixture(params=CLIENT_KINDS)
def client_for(request: pytest.FixtureRequest) -> Iterator[ClientFactory]:
    """``client_for(script, **kw)`` → (a client on ``script``, the delays it slept), for each of the
    two clients, so one test runs through HitlClient and AsyncHitlClient alike."""
    yield from client_factory(request.param)


# --------------------------------------------------------------------------- the archive (SQLite and PostgreSQL)

DIALECTS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer(require_postgres()).start()
    yield server
    server.stop()


def _url(dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if dialect == "sqlite":
        return f"sqlite:///{tmp_path / 'archive.sqlite3'}"
    pg: PostgresServer = request.getfixturevalue("postgres")
    pg.reset()
    return pg.url


@pytest.fixture(params=DIALECTS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind (nothing migrated)."""
    return _url(request.param, tmp_path, request)


@pytest.fixture(params=DIALECTS)
def archive(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Archive]:
    """A migrated, empty archive of each kind."""
    url = _url(request.param, tmp_path, request)
    migrate.upgrade(url)
    a = Archive(url)
    yield a
    a.close()


# Browser modules that need the same `hitl up` share one (tests/browser_stack.shared_ui_up): a module
# names its group in SHARED_UI; the group's modules run one after another, and its `hitl up` stops
# after the last of them, so no idle Ray cluster lingers under the rest of the run.


def _shared_group(item: pytest.Item | None) -> str | None:
    module = getattr(item, "module", None) if item is not None else None
    return getattr(module, "SHARED_UI", None)


# An async test gets a deadline of its own, below pytest-timeout's (pyproject.toml: 600 s): past it,
# asyncio cancels the await it is stuck on, so the failure names that await, its fixtures tear down,
# and the event loop the session shares stays usable. pytest-timeout's signal instead interrupts the
# loop mid-iteration, leaving its tasks (and what they started) behind for the tests after it.
ASYNC_DEADLINE_S = float(os.environ.get("HITL_TEST_DEADLINE_S", "300"))
STACK_DEADLINE_S = 540.0  # a test that starts Ray or a browser (markers ray, ray_cluster, browser)
STACK_MARKS = frozenset({"ray", "ray_cluster", "browser"})


def _deadlined(fn: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(seconds):
                return await fn(*args, **kwargs)
        except TimeoutError as e:
            raise AssertionError(f"the test did not finish within its {seconds:.0f} s deadline") from e

    return run


# The tests a full run measured too slow for `make test-fast` (scripts/slow_tests.py writes the list).
SLOW_LIST = Path(__file__).with_name("slow_tests.txt")


def _measured_slow() -> frozenset[str]:
    if not SLOW_LIST.exists():
        return frozenset()
    lines = (line.strip() for line in SLOW_LIST.read_text().splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each group's items moved to where its first item was, in their order; every other item stays.
    Every async test's function wrapped in its deadline (``ASYNC_DEADLINE_S``); the tests of
    ``SLOW_LIST`` marked slow."""
    slow = _measured_slow()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
        fn = getattr(item, "obj", None)
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(fn):
            stack = not STACK_MARKS.isdisjoint(m.name for m in item.iter_markers())
            item.obj = _deadlined(fn, max(ASYNC_DEADLINE_S, STACK_DEADLINE_S) if stack else ASYNC_DEADLINE_S)
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        group = _shared_group(item)
        if group is not None:
            first.setdefault(group, i)
    if first:
        place = {id(item): (first.get(_shared_group(item) or "", i), i) for i, item in enumerate(items)}
        items.sort(key=lambda item: place[id(item)])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the module's fixtures are torn down first (its pages, its browser, its live jobs cancelled)
    group = _shared_group(item)
    if group is not None and _shared_group(nextitem) != group:
        stop_shared(group)
