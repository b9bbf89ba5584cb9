"""Publish order survives batching and batches in flight."""

from __future__ import annotations

import asyncio

import redis

import streamsub
from tests._layout import stream_key


async def test_messages_of_one_key_are_stored_in_publish_order(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """With many batches in flight at once, each key's messages sit in its
    partition in the order they were published."""
    await client.create_topic("ordered", partitions=4)
    keys = [f"key-{k}" for k in range(10)]
    chunks = [
        [
            streamsub.OutgoingMessage(data=f"{c}:{i}".encode(), ordering_key=keys[i % 10])
            for i in range(500)
        ]
        for c in range(20)
    ]
    # All twenty calls are queued before the first write completes.
    ids = await asyncio.gather(*(client.publish_many("ordered", chunk) for chunk in chunks))

    stored: dict[str, list[bytes]] = {key: [] for key in keys}
    for partition in range(4):
        for _, fields in redis_client.xrange(stream_key(redis_client, "ordered", partition)):
            stored[fields[b"k"].decode()].append(fields[b"d"])
    for key in keys:
        expected = [m.data for chunk in chunks for m in chunk if m.ordering_key == key]
        assert stored[key] == expected, f"{key} out of order"
    assert sum(len(chunk_ids) for chunk_ids in ids) == 10_000
