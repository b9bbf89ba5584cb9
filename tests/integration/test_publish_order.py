"""Publish order survives batching and batches in flight."""

from __future__ import annotations

import asyncio
import time

import redis

import streamsub
from streamsub._backends.base import BrokenLinkError, Link, TopicRecord
from streamsub._core.codec import encode
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND, stream_key


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


async def test_a_linked_write_runs_only_after_the_write_it_follows(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """The backend's link check, per partition of one append: a write linked after
    the writer's stored write is stored; one linked after a write that was never
    stored answers BrokenLinkError and stores nothing, while the same append's
    other partitions are stored; an unlinked write always runs."""
    redis_client.flushall()
    backend = TEST_BACKEND(server.url)
    try:
        topic = await backend.create_topic(TopicRecord("links", 3, "", time.time()))

        def packed(*data: bytes) -> bytes:
            return b"".join(encode(d, max_bytes=1024).packed for d in data)

        first = await backend.append(
            topic,
            {0: packed(b"a1", b"a2"), 1: packed(b"b1")},
            {0: Link("w", 1, None), 1: Link("w", 1, None)},
        )
        assert [len(first[0]), len(first[1])] == [2, 1]  # type: ignore[arg-type]
        second = await backend.append(
            topic,
            {0: packed(b"a3"), 1: packed(b"b2"), 2: packed(b"c1")},
            # Partition 1 claims to follow write 7, which was never stored there.
            {0: Link("w", 2, 1), 1: Link("w", 2, 7), 2: Link("w", 2, None)},
        )
        assert isinstance(second[0], list)
        assert isinstance(second[2], list)
        assert isinstance(second[1], BrokenLinkError)
        # Another writer's links are its own; unlinked writes are not checked.
        other = await backend.append(
            topic, {1: packed(b"b3"), 2: packed(b"c2")}, {1: Link("v", 1, None), 2: Link("w", 3, 1)}
        )
        assert isinstance(other[1], list)
        assert isinstance(other[2], BrokenLinkError)
        await backend.append(topic, {2: packed(b"c3")})
    finally:
        await backend.close()

    def data(partition: int) -> list[bytes]:
        return [
            f[b"d"] for _, f in redis_client.xrange(stream_key(redis_client, "links", partition))
        ]

    assert data(0) == [b"a1", b"a2", b"a3"]
    assert data(1) == [b"b1", b"b3"]
    assert data(2) == [b"c1", b"c3"]
