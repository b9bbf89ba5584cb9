"""Publishing while one master is dead and not yet replaced (issue 9: "the rest
of the library must not notice"; "Done when, Failover": the stall is no longer
than the failover itself plus a bounded retry). A batch for the dead master's
partition waits, routed afresh and retried up to the socket timeout (README,
Redis Cluster, Failover); the question here is what a publish to a partition
on a healthy master, by the same client, waits meanwhile. Key order needs
only each partition's batches to stay in order."""

from __future__ import annotations

import asyncio
import time

import pytest

import streamsub
from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import owner_port, partition_slot

PARTITIONS = 6
HEALTHY_WITHIN = 1.0
"""Seconds a publish to a healthy master's partition may take."""


def _keys_of(partition: int, count: int) -> list[str]:
    keys = (f"key-{n}" for n in range(10_000))
    return [k for k in keys if streamsub.fnv1a_32(k.encode()) % PARTITIONS == partition][:count]


def _key_of(partition: int) -> str:
    return _keys_of(partition, 1)[0]


@pytest.mark.timeout(90)
async def test_publishes_to_healthy_masters_do_not_wait_for_a_dead_one(
    slow_cluster: RedisClusterServers,
) -> None:
    """Partition 0's master is SIGKILLed (its replica takes over only after
    about 30 s). While that client keeps publishing to partition 0 under 8
    keys at once (each publish waits, then fails), 20 publishes of it to each partition on the
    other masters return their ids, each within a second."""
    cluster = slow_cluster
    async with streamsub.connect(cluster.url) as client:
        await client.create_topic("halves", partitions=PARTITIONS)
        ports = {
            p: owner_port(cluster, partition_slot(cluster, "halves", p)) for p in range(PARTITIONS)
        }
        healthy = [p for p in range(PARTITIONS) if ports[p] != ports[0]]
        assert healthy
        for p in range(PARTITIONS):  # every node's connection made before the kill
            await client.publish("halves", b"warm", ordering_key=_key_of(p))
        victim = next(s for s in cluster.servers if s.port == ports[0])
        victim.kill()
        failed: list[str] = []

        async def to_the_dead_one(key: str) -> None:
            while True:
                try:
                    await client.publish("halves", b"dead", ordering_key=key)
                except streamsub.UnavailableError as exc:
                    failed.append(str(exc)[:80])
                except streamsub.OrderingKeyPausedError:
                    client.resume_publish("halves", key)
                await asyncio.sleep(0.05)

        stuck = [asyncio.create_task(to_the_dead_one(k)) for k in _keys_of(0, 8)]
        await asyncio.sleep(0.5)
        slow: list[tuple[int, float]] = []
        for n in range(20):
            for p in healthy:
                started = time.monotonic()
                message_id = await client.publish("halves", b"%d" % n, ordering_key=_key_of(p))
                took = time.monotonic() - started
                assert message_id.startswith(f"{p}-")
                if took > HEALTHY_WITHIN:
                    slow.append((p, round(took, 1)))
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
    assert not slow, f"publishes to healthy masters waited for the dead one: {slow[:5]}"
