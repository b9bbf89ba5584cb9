"""Publish durability with fsync on a real Redis Cluster: WAITAOF behind each
node's batches, and a master without AOF refused at connect by name.

Runs on the session's cluster when its binary has WAITAOF, else on a private
cluster of the Valkey that scripts/test downloads; skipped, naming the
binary's version, only when neither is there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import streamsub
from streamsub.testing import RedisClusterServers, redis_cluster
from tests import _servers


@pytest.fixture(scope="module")
def waitaof_cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    redis_binary: str | None,
) -> Iterator[RedisClusterServers]:
    """A cluster (3 masters, 1 replica each, AOF on) whose servers have WAITAOF."""
    session = redis_binary or _servers.find_redis_server()
    binary = _servers.with_waitaof(redis_binary)
    if binary is None:
        pytest.skip(f"{_servers.describe(session)} has no WAITAOF (7.2+) and no Valkey is cached")
    if binary == session:
        yield request.getfixturevalue("cluster")
        return
    with redis_cluster(tmp_path_factory.mktemp("cluster"), binary=binary) as private:
        yield private


@pytest.fixture
def fsync_cluster(waitaof_cluster: RedisClusterServers) -> RedisClusterServers:
    """The WAITAOF cluster, emptied."""
    inspect = waitaof_cluster.client()
    inspect.flushall()
    inspect.close()
    return waitaof_cluster


def _stream_lengths_on_replicas(cluster: RedisClusterServers) -> int:
    """The entries of every ss:* stream held by the replicas (each key once)."""
    masters = set(cluster.master_ports())
    total = 0
    for port in set(cluster.ports) - masters:
        node = cluster.node(port)
        try:
            node.execute_command("READONLY")
            for key in node.scan_iter(match="ss:*", _type="stream"):
                total += int(node.xlen(key))
        finally:
            node.close()
    return total


async def test_fsync_durability_confirms_each_batch_on_every_master_and_its_replica(
    fsync_cluster: RedisClusterServers,
) -> None:
    """With Durability(replicas=1, fsync=True), 3,000 messages over 16
    partitions (on all three masters) return their ids once WAITAOF confirmed
    them, on every master, and the replicas hold all 3,000 when they do."""
    async with streamsub.connect(fsync_cluster.url) as plain:
        await plain.create_topic("fsynced", partitions=16)
    durability = streamsub.Durability(replicas=1, fsync=True)
    async with streamsub.connect(fsync_cluster.url, durability=durability) as durable:
        ids = await durable.publish_many(
            "fsynced",
            [
                streamsub.OutgoingMessage(data=b"m%d" % i, ordering_key=f"k{i % 64}")
                for i in range(3000)
            ],
        )
        held = _stream_lengths_on_replicas(fsync_cluster)
    assert len(set(ids)) == 3000
    assert held == 3000
    for port in fsync_cluster.master_ports():
        node = fsync_cluster.node(port)
        try:
            stats = node.info("commandstats")
            assert int(stats["cmdstat_waitaof"]["calls"]) >= 1, port
            assert "cmdstat_wait" not in stats, port
        finally:
            node.close()


async def test_fsync_durability_is_refused_at_connect_naming_a_master_without_aof(
    fsync_cluster: RedisClusterServers,
) -> None:
    """One master with appendonly no makes connect raise FailedPreconditionError
    naming that master; with AOF back on, connect succeeds."""
    port = fsync_cluster.master_ports()[1]
    node: redis.Redis = fsync_cluster.node(port)
    try:
        node.config_set("appendonly", "no")
        durability = streamsub.Durability(fsync=True)
        with pytest.raises(
            streamsub.FailedPreconditionError, match=rf"127\.0\.0\.1:{port} runs with appendonly no"
        ):
            async with streamsub.connect(fsync_cluster.url, durability=durability):
                pass
    finally:
        node.config_set("appendonly", "yes")
        node.close()
    async with streamsub.connect(fsync_cluster.url, durability=durability) as durable:
        await durable.create_topic("fsynced-again", partitions=3)
        assert len(await durable.publish_many("fsynced-again", [b"a", b"b", b"c"])) == 3
