"""Fixtures of the cluster tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streamsub.testing import RedisClusterServers, redis_cluster

SLOW_NODE_TIMEOUT_MS = 15_000
"""cluster-node-timeout of ``slow_cluster``: no replica is promoted for about 18 s
(measured: a SIGKILLed master's replica took over after 18.1 s)."""


@pytest.fixture
def emptied(cluster: RedisClusterServers) -> RedisClusterServers:
    """The session cluster, emptied."""
    inspect = cluster.client()
    inspect.flushall()
    inspect.close()
    return cluster


@pytest.fixture
def slow_cluster(tmp_path: Path) -> Iterator[RedisClusterServers]:
    """A private 3+3 cluster whose replicas wait 15 s before taking over, so a
    test can work with a master down and not yet replaced."""
    with redis_cluster(
        tmp_path, extra_args=("--cluster-node-timeout", str(SLOW_NODE_TIMEOUT_MS))
    ) as private:
        yield private
