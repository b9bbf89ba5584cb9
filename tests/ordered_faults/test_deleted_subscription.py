"""Deleting an ordered subscription while its subscribers still run.

Its partition-ownership records go with it (``delete_subscription``), and a
subscriber still renewing its membership must not write them back: they would
stay in Redis for good, owned by a subscription that no longer exists."""

from __future__ import annotations

import asyncio

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._wait import until
from tests.ordered_faults._keys import keyed, ordered


def _ownership_keys(redis_client: redis.Redis) -> list[str]:
    keys = ["ss:{own.billing}:members", "ss:{own.billing}:owners"]
    return [key for key in keys if redis_client.exists(key)]


@pytest.mark.timeout(60)
async def test_subscribers_of_a_deleted_subscription_stop_and_leave_no_ownership_records(
    client: streamsub.Client,
    server: RedisServer,
    redis_client: redis.Redis,
    short_ownership_lease: float,
) -> None:
    """Two ordered subscribers share four partitions, each busy in handlers that
    hold their messages; the subscription is deleted. Both stop with
    SubscriptionNotFoundError, and no ownership record is left or written back
    by their heartbeats, during their handlers' last moments or after."""
    await ordered(client, partitions=4)
    started = 0
    hold = asyncio.Event()

    async def held(message: streamsub.Message) -> None:
        nonlocal started
        started += 1
        await hold.wait()

    async with streamsub.connect(server.url) as other:
        a = client.subscribe("billing", held, consumer="a")
        b = other.subscribe("billing", held, consumer="b")

        async def run() -> None:
            async with a, b:
                await until(
                    lambda: len(a.statistics().partitions) == 2 == len(b.statistics().partitions),
                    20,
                    "a and b to own two partitions each",
                )
                await client.publish_many("orders", keyed([f"k{i}" for i in range(16)], 0, 5))
                await until(lambda: started >= 4, 20, "handlers to run in every partition")
                assert _ownership_keys(redis_client) != []
                await client.delete_subscription("billing")
                assert _ownership_keys(redis_client) == []
                # Several heartbeats (a third of the lease apart) while handlers hold.
                await asyncio.sleep(short_ownership_lease)
                assert _ownership_keys(redis_client) == [], "a heartbeat wrote the records back"
                hold.set()
                await until(
                    lambda: (
                        isinstance(a.error, streamsub.SubscriptionNotFoundError)
                        and isinstance(b.error, streamsub.SubscriptionNotFoundError)
                    ),
                    20,
                    "both subscribers to stop",
                )

        with pytest.raises(streamsub.SubscriptionNotFoundError):
            await run()
    assert _ownership_keys(redis_client) == []
