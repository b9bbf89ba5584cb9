"""Fixtures shared by every test: a real, private redis-server per session.

With ``STREAMSUB_TEST_BACKEND=cluster`` the session's server is a private Redis
Cluster instead (3 masters, 3 replicas, slow to fail over): ``server.url`` is its
``redis+cluster://`` URL and ``redis_client`` a cluster-aware client, so the
same tests run on both.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

import streamsub
from streamsub.testing import RedisClusterServers, RedisServer, redis_cluster, redis_server
from tests import _task_dump
from tests._proxy import Proxy

_task_dump.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _task_dump.watched(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _task_dump.watched(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    return (yield from _task_dump.watched(item))


@pytest.fixture(scope="session")
def redis_binary() -> str | None:
    """The redis-server to test against: $STREAMSUB_TEST_REDIS_SERVER, else PATH's."""
    return os.environ.get("STREAMSUB_TEST_REDIS_SERVER") or None


SESSION_NODE_TIMEOUT_MS = 20_000
"""The session cluster's ``cluster-node-timeout``: no failover unless a master is
gone for good."""
ON_CLUSTER = os.environ.get("STREAMSUB_TEST_BACKEND", "standalone") == "cluster"
"""Whether the session's server is a Redis Cluster (``STREAMSUB_TEST_BACKEND=cluster``)."""
if os.environ.get("STREAMSUB_TEST_BACKEND", "standalone") not in ("standalone", "cluster"):
    raise RuntimeError("STREAMSUB_TEST_BACKEND must be 'standalone' (the default) or 'cluster'")


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_binary: str | None
) -> Iterator[RedisClusterServers]:
    """A private Redis Cluster (3 masters, 3 replicas, AOF on) for this test session."""
    with redis_cluster(tmp_path_factory.mktemp("cluster"), binary=redis_binary) as running:
        yield running


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    redis_binary: str | None,
) -> Iterator[RedisServer]:
    """A redis-server with AOF on, private to this test session (a private cluster
    under ``STREAMSUB_TEST_BACKEND=cluster``: only its ``url`` is used then)."""
    if ON_CLUSTER:
        # Not the failover tests' cluster (cluster-node-timeout 2 s): on a busy
        # 2-core machine a master starved of CPU for 2 s was failed over in the
        # middle of unrelated tests. Failover is tests/cluster's subject.
        with redis_cluster(
            tmp_path_factory.mktemp("cluster-server"),
            binary=redis_binary,
            extra_args=("--cluster-node-timeout", str(SESSION_NODE_TIMEOUT_MS)),
        ) as running:
            yield running
        return
    with redis_server(tmp_path_factory.mktemp("redis"), binary=redis_binary) as running:
        yield running


@pytest.fixture
def redis_client(server: RedisServer) -> Iterator[redis.Redis]:
    """A plain synchronous redis-py client on the test server, for inspecting state
    (a cluster-aware one on a cluster: it routes each key to its node)."""
    client: redis.Redis = (
        server.client()  # type: ignore[assignment]
        if isinstance(server, RedisClusterServers)
        else redis.Redis.from_url(server.url)
    )
    yield client
    client.close()


@pytest.fixture
async def client(server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[streamsub.Client]:
    """A streamsub client on an emptied test server."""
    redis_client.flushall()
    async with streamsub.connect(server.url) as connected:
        yield connected


@pytest.fixture
def private_server(data_dir: Path, redis_binary: str | None) -> Iterator[RedisServer]:
    """A redis-server of the test's own (standalone), for tests that change its
    settings (maxmemory) or pause its writes (CLIENT PAUSE)."""
    with redis_server(data_dir, binary=redis_binary) as running:
        yield running


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A private directory for a test's own servers."""
    return tmp_path


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    """An unstarted TCP proxy on loopback (tests/_proxy.py), closed when the test ends."""
    async with Proxy() as running:
        yield running


@pytest.fixture
def short_ownership_lease(monkeypatch: pytest.MonkeyPatch) -> float:
    """A 2 s partition lease on ordered subscriptions, so that a lapse shows within
    a test."""
    from streamsub._engine import ownership

    monkeypatch.setattr(ownership, "OWNERSHIP_LEASE", 2.0)
    return 2.0
