"""Publishing into a slot that is migrating, from a publisher that has not
written to that partition in the last minute (issue 9, "Done when: Resharding";
README, Redis Cluster, Publishing: a batch answered ASK is sent to the
importing node). Every write names the publisher's link key on its partition
(append.lua), which a new publisher (a new process, a new client, or one idle
on that partition for a minute: the link expires) does not have yet: a key
that exists on neither node."""

from __future__ import annotations

import pytest

import streamsub
from streamsub._backends.redis import _keys
from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import partition_slot, slot_held_migrating

PARTITIONS = 3


def _key_of(partition: int) -> str:
    """An ordering key that goes to ``partition``."""
    return next(
        key
        for key in (f"key-{n}" for n in range(10_000))
        if streamsub.fnv1a_32(key.encode()) % PARTITIONS == partition
    )


@pytest.mark.timeout(60)
async def test_a_new_publisher_publishes_into_a_slot_held_migrating(
    emptied: RedisClusterServers,
) -> None:
    """A 3-partition topic has messages on every partition; partition 0's slot is
    then held migrating with its keys already moved (the window redis-cli
    --cluster reshard opens). Two clients that never published to the topic
    each publish 100 keyed messages to partition 0 in that window: every
    publish returns an id, in publish order, and the stream holds them all."""
    cluster = emptied
    async with streamsub.connect(cluster.url) as admin:
        await admin.create_topic("moving", partitions=PARTITIONS)
        await admin.publish_many(
            "moving",
            [
                streamsub.OutgoingMessage(data=b"before", ordering_key=_key_of(p))
                for p in range(PARTITIONS)
            ],
        )
    slot = partition_slot(cluster, "moving", 0)
    key = _key_of(0)
    with slot_held_migrating(cluster, slot):
        for name in ("first", "second"):
            async with streamsub.connect(cluster.url) as client:
                outcomes = [
                    await client.publish("moving", b"%s-0" % name.encode(), ordering_key=key)
                ]
                outcomes += await client.publish_many(
                    "moving",
                    [
                        streamsub.OutgoingMessage(
                            data=b"%s-%d" % (name.encode(), n), ordering_key=key
                        )
                        for n in range(1, 100)
                    ],
                )
            assert all(o.startswith("0-") for o in outcomes), outcomes[:3]
            order = [tuple(map(int, o.split("-")[1:])) for o in outcomes]
            assert order == sorted(order)
    inspect = cluster.client()
    try:
        salts = [int(s) for s in inspect.hget(_keys.topic_key("moving"), "salts").split()]
        stream = _keys.stream_key(_keys.partition_tag("moving", 0, salts[0]))
        length = inspect.xlen(stream)
    finally:
        inspect.close()
    assert length == 201
