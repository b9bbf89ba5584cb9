"""Fixtures shared by every test: a real, private redis-server per session."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer, redis_server
from tests._proxy import Proxy


@pytest.fixture(scope="session")
def redis_binary() -> str | None:
    """The redis-server to test against: $STREAMSUB_TEST_REDIS_SERVER, else PATH's."""
    return os.environ.get("STREAMSUB_TEST_REDIS_SERVER") or None


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory, redis_binary: str | None
) -> Iterator[RedisServer]:
    """A redis-server with AOF on, private to this test session."""
    with redis_server(tmp_path_factory.mktemp("redis"), binary=redis_binary) as running:
        yield running


@pytest.fixture
def redis_client(server: RedisServer) -> Iterator[redis.Redis]:
    """A plain synchronous redis-py client on the test server, for inspecting state."""
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()


@pytest.fixture
async def client(server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[streamsub.Client]:
    """A streamsub client on an emptied test server."""
    redis_client.flushall()
    async with streamsub.connect(server.url) as connected:
        yield connected


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
