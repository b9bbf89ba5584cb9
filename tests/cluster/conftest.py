"""Fixtures of the cluster tests."""

from __future__ import annotations

import pytest

from streamsub.testing import RedisClusterServers


@pytest.fixture
def emptied(cluster: RedisClusterServers) -> RedisClusterServers:
    """The session cluster, emptied."""
    inspect = cluster.client()
    inspect.flushall()
    inspect.close()
    return cluster
