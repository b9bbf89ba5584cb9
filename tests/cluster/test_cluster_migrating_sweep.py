"""The ordered sweep's check of a blocked key (Reclaimer._check_blocking:
``Backend.pending_owners``, XPENDING per entry) into a partition whose slot is
migrating. README, Redis Cluster: "Acks, lease extensions, nacks, sweeps and
reads follow a moved slot themselves, not through redis-py" (whose ``ASK``
handling sends ``ASKING`` and the command on two pooled connections, failing
"TTL exhausted" while several are free)."""

from __future__ import annotations

import asyncio

import streamsub
from streamsub._backends.redis._cluster import RedisClusterBackend
from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import partition_slot, slot_held_migrating, warm_pool

TOPIC, GROUP, PARTITIONS, MESSAGES = "sweeping", "sweeping-sub", 4, 200


async def test_the_owner_check_of_blocked_entries_succeeds_into_a_migrating_slot(
    emptied: RedisClusterServers,
) -> None:
    """200 messages over 4 partitions are read by consumer c1. With partition
    0's slot held MIGRATING (its keys already on the importing node) and free
    pooled connections to both nodes, pending_owners of every held entry of
    every partition names c1, and an entry acknowledged meanwhile names no
    one."""
    cluster = emptied
    async with streamsub.connect(cluster.url) as client:
        await client.create_topic(TOPIC, partitions=PARTITIONS)
        await client.create_subscription(GROUP, topic=TOPIC, ack_deadline=60.0)
        await asyncio.gather(
            *(client.publish(TOPIC, b"%d" % i, ordering_key=f"k{i}") for i in range(MESSAGES))
        )
        backend = client._backend
        assert isinstance(backend, RedisClusterBackend)
        record = await backend.get_topic(TOPIC)
        assert record is not None
        held: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
        while sum(map(len, held.values())) < MESSAGES:
            entries = await backend.read(record, GROUP, "c1", range(PARTITIONS), 1000, None)
            assert entries, "messages missing"
            for entry in entries:
                held[entry.partition].append(entry.entry_id)
        acked = held[0].pop()
        assert await backend.ack(record, GROUP, {0: [acked]}) == 1
        with slot_held_migrating(cluster, partition_slot(cluster, TOPIC, 0)) as (source, target):
            await warm_pool(backend, source)
            await warm_pool(backend, target)
            owners = await backend.pending_owners(record, GROUP, {**held, 0: [*held[0], acked]})
    assert owners == {
        **{(p, i): "c1" for p, ids in held.items() for i in ids},
        (0, acked): None,
    }
