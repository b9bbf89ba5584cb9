"""Publish durability on a cluster is judged per node (issue 9, "What to build
4" and "Done when: Failover"): once a killed master's replica has taken over,
that new master has no replica until the old one comes back, so
Durability(replicas=1) cannot be met for its partitions; publishes to
partitions on the other masters, whose replicas confirmed them, still return
their ids, also when they share a batch with the refused ones."""

from __future__ import annotations

import asyncio

import pytest

import streamsub
from streamsub._backends.redis import _keys
from streamsub._core.partition import partition_for_key
from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import kill_master

PARTITIONS = 8


@pytest.mark.timeout(120)
async def test_publishes_to_masters_with_a_replica_succeed_while_one_master_has_none(
    emptied: RedisClusterServers,
) -> None:
    """After partition 0's master is SIGKILLed and replaced by its replica (now a
    master without replica), concurrent keyed publishes with Durability(replicas=1)
    to all 8 partitions: every publish to a partition whose master still has a
    replica returns an id (its WAIT confirmed it); every one to the replica-less
    master fails with UnavailableError saying no replica confirmed it."""
    cluster = emptied
    durability = streamsub.Durability(replicas=1, timeout=3.0)
    async with streamsub.connect(cluster.url, durability=durability) as client:
        await client.create_topic("lonely", partitions=PARTITIONS)
        record = await client._backend.get_topic("lonely")
        assert record is not None
        inspect = cluster.client()
        slot = inspect.keyslot(_keys.stream_key(_keys.partition_tag("lonely", 0, record.salts[0])))
        inspect.close()
        before = await client._backend.partition_nodes(record)  # type: ignore[attr-defined]
        # Once every node that runs agrees on the new master (on a busy machine
        # the others learn of it later, and answer publishes CLUSTERDOWN or
        # MOVED meanwhile, which is the failover, not what this test is about).
        struck = await asyncio.to_thread(kill_master, cluster, slot, restart=False)
        old = struck.old
        try:
            lonely = {p for p, node in enumerate(before) if node == f"127.0.0.1:{old}"}
            assert 0 in lonely
            assert len(lonely) < PARTITIONS
            keys = [f"k{i}" for i in range(64)]
            healthy = [k for k in keys if partition_for_key(k, PARTITIONS) not in lonely]
            results = await asyncio.gather(
                *(client.publish("lonely", k.encode(), ordering_key=k) for k in keys),
                return_exceptions=True,
            )
            outcome = dict(zip(keys, results, strict=True))
            refused = {k: str(outcome[k])[:120] for k in healthy if not isinstance(outcome[k], str)}
            assert refused == {}, (
                f"{len(refused)} of {len(healthy)} publishes to partitions on masters with a "
                f"replica failed: {next(iter(refused.values()))}"
            )
            unconfirmed = [outcome[k] for k in keys if k not in healthy]
            assert unconfirmed
            for result in unconfirmed:
                assert isinstance(result, streamsub.UnavailableError), result
                assert "only 0 of the 1 replicas" in str(result)
        finally:
            server = next(s for s in cluster.servers if s.port == old)
            server.start()
            await asyncio.to_thread(cluster.wait_ready)
