"""A client closed while its first publishes to a topic still look the topic up.

The first publishes of a topic wait for its record (one lookup, shared) before
they queue their messages. A close that comes meanwhile must still write them:
they were called before it (a script that publishes and exits closes its
blocking client at once, at interpreter exit: it lost half of 2,000 messages
on a cluster, the publisher made after the close began being cut off)."""

from __future__ import annotations

import asyncio

import redis

import streamsub
from streamsub.testing import RedisServer
from tests._layout import stream_key

PARTITIONS = 4


async def test_a_close_writes_the_publishes_called_before_it_that_still_look_up_the_topic(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """300 ``publish()`` calls over 7 keys and 3 ``publish_many`` of 100, all
    begun on a fresh client (waiting for the topic's record) when ``aclose()``
    is called: once it returns, every call has its ids and all 600 messages are
    stored, each key's in call order."""
    async with streamsub.connect(server.url) as admin:
        await admin.create_topic("closing", partitions=PARTITIONS)
    client = streamsub.connect(server.url)
    singles = [
        asyncio.create_task(client.publish("closing", f"{i}".encode(), ordering_key=f"k{i % 7}"))
        for i in range(300)
    ]
    batches = [
        asyncio.create_task(
            client.publish_many(
                "closing",
                [
                    streamsub.OutgoingMessage(data=f"{n}".encode(), ordering_key=f"k{n % 7}")
                    for n in range(300 + 100 * b, 400 + 100 * b)
                ],
            )
        )
        for b in range(3)
    ]
    await asyncio.sleep(0)  # every call has begun; the first looks the topic up
    await client.aclose()
    unfinished = [task for task in [*singles, *batches] if not task.done()]
    assert not unfinished, f"{len(unfinished)} of 303 calls were not done when aclose() returned"
    for task in [*singles, *batches]:
        task.result()  # each has its ids: none failed
    per_key: dict[str, list[int]] = {}
    for partition in range(PARTITIONS):
        for _, fields in redis_client.xrange(stream_key(redis_client, "closing", partition)):
            per_key.setdefault(fields[b"k"].decode(), []).append(int(fields[b"d"]))
    assert sum(len(v) for v in per_key.values()) == 600
    assert all(v == sorted(v) for v in per_key.values()), "a key's messages out of call order"
