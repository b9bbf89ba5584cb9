"""Scaling out an ordered subscription while a key waits out a nack's backoff.

The owner hands a newcomer's partition over only once it holds nothing of it;
a key blocked on a nacked message holds its later messages until the backoff
ends (up to Pub/Sub's 600 s maximum), so the newcomer gets nothing of that
partition meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

import streamsub
from streamsub._core.partition import partition_for_key
from streamsub.testing import RedisServer
from tests._wait import until
from tests.ordered_faults._keys import index, keyed, ordered

BACKOFF = 60.0


@pytest.mark.timeout(60)
async def test_a_joining_subscriber_gets_its_partition_while_a_key_there_waits_out_a_backoff(
    client: streamsub.Client, server: RedisServer
) -> None:
    """Subscriber a owns both partitions; message 0 of a key in partition 1 (the
    newcomer's share) is nacked with a 60-s backoff, holding its 9 later messages
    back. Subscriber b joins: it must own partition 1 within a few heartbeats
    (10 s), not after the backoff (README: "A joining subscriber gets its share
    cooperatively: the current owner stops reading the partition, lets the
    messages it holds of it finish, then releases it"; issue 7: "rebalanced when
    subscribers join"). The nacked message is then taken over by b before the
    key's later messages ("A nack whose backoff outlasts a partition's move is
    taken over (redelivered) early by the new owner")."""
    await ordered(client, partitions=2, backoff=BACKOFF)
    key = next(k for k in (f"k{i}" for i in range(100)) if partition_for_key(k, 2) == 1)
    seen: list[tuple[int, int, str]] = []

    def recorder(name: str) -> Callable[[streamsub.Message], Awaitable[None]]:
        async def handle(message: streamsub.Message) -> None:
            seen.append((index(message), message.delivery_attempt, name))
            if index(message) == 0 and message.delivery_attempt == 1:
                raise RuntimeError("not yet")

        return handle

    other = streamsub.connect(server.url)
    try:
        async with client.subscribe("billing", recorder("a"), consumer="a") as first:
            await until(lambda: len(first.statistics().partitions) == 2, 15, "a to own both")
            await client.publish_many("orders", keyed([key], 0, 10))
            await until(lambda: bool(seen), 15, "the nack")
            await until(lambda: first.statistics().held_for_order == 9, 15, "the key held back")
            async with other.subscribe("billing", recorder("b"), consumer="b") as second:
                await until(
                    lambda: second.statistics().partitions == (1,),
                    10,
                    "b to own partition 1 (a holds it until the key's backoff ends)",
                )
                await until(lambda: len(seen) == 11, 15, "the rest of the key")
                await asyncio.sleep(0)
    finally:
        await other.aclose()
    assert [(i, attempt) for i, attempt, _ in seen] == [(0, 1), (0, 2)] + [
        (n, 1) for n in range(1, 10)
    ]
