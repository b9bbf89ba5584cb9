"""A read answered NOGROUP while the subscription and its topic both exist is
retried, not taken for a deleted subscription (issue 9, What to build 3: on a
cluster a node that has not caught up with a failover or a moved slot answers
so for moments). A deleted subscription still ends its subscribers
(tests/ordered_faults/test_deleted_subscription.py)."""

from __future__ import annotations

import asyncio
import collections
import logging

import pytest
import redis

import streamsub
from tests._wait import until

PARTITIONS = 4
BATCH = 400


@pytest.mark.timeout(90)
@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_a_consumer_group_missing_for_a_moment_is_retried_not_fatal(
    client: streamsub.Client,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    ordered: bool,
) -> None:
    """Two subscribers read a 4-partition topic, whose retention is then changed
    (the subscribers keep the topic record they started with); partition 0's
    consumer group is destroyed, 400 keyed messages are published over all partitions, and 1.5 s
    later the group is created again where it was. Both subscribers keep
    running (no error), every message is handled once (within the default
    30 s ack deadline), and the log says the group was missing."""
    caplog.set_level(logging.WARNING, logger="streamsub")
    await client.create_topic("gone", partitions=PARTITIONS)
    await client.create_subscription("gone-sub", topic="gone", enable_message_ordering=ordered)
    record = await client._backend.get_topic("gone")
    assert record is not None
    stream = client._backend._keys(record)[0]  # type: ignore[attr-defined]
    handled: collections.Counter[bytes] = collections.Counter()

    async def handler(message: streamsub.Message) -> None:
        handled[message.data] += 1

    def publish(first: int) -> list[streamsub.OutgoingMessage]:
        return [
            streamsub.OutgoingMessage(data=b"%d" % n, ordering_key=f"k{n % 40}")
            for n in range(first, first + BATCH)
        ]

    async with (
        client.subscribe("gone-sub", handler, consumer="a") as a,
        client.subscribe("gone-sub", handler, consumer="b") as b,
    ):
        await client.publish_many("gone", publish(0))
        await until(lambda: len(handled) == BATCH, 30, "the first messages handled")
        await until(lambda: not redis_client.xpending(stream, "gone-sub")["pending"], 30, "acks")
        await client.update_topic_retention("gone", streamsub.Retention(max_length=100_000))
        position = next(
            g["last-delivered-id"]
            for g in redis_client.xinfo_groups(stream)
            if g["name"] == b"gone-sub"
        )
        redis_client.xgroup_destroy(stream, "gone-sub")
        await client.publish_many("gone", publish(BATCH))
        await asyncio.sleep(1.5)
        assert a.error is None
        assert b.error is None
        redis_client.xgroup_create(stream, "gone-sub", id=position)
        await until(lambda: len(handled) == 2 * BATCH, 30, "every message handled")
        assert a.error is None
        assert b.error is None
    assert any("has no consumer group" in r.getMessage() for r in caplog.records)
    # Nothing read from the partitions that kept their group was held back
    # until its ack deadline and handled again.
    assert max(handled.values()) == 1


@pytest.mark.timeout(60)
async def test_a_subscription_whose_groups_are_all_gone_ends_its_subscribers(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A deletion that stopped half done (every partition's consumer group
    destroyed, the subscription's record left): the subscribers end with
    SubscriptionNotFoundError rather than retry for ever."""
    await client.create_topic("half", partitions=PARTITIONS)
    await client.create_subscription("half-sub", topic="half")
    record = await client._backend.get_topic("half")
    assert record is not None

    async def handler(message: streamsub.Message) -> None:
        pass

    # Leaving the block raises what ended the subscribers.
    with pytest.raises(streamsub.SubscriptionNotFoundError):  # noqa: PT012 (raised on leaving)
        async with (
            client.subscribe("half-sub", handler, consumer="a") as a,
            client.subscribe("half-sub", handler, consumer="b") as b,
        ):
            await asyncio.sleep(0.5)
            for stream in client._backend._keys(record):  # type: ignore[attr-defined]
                redis_client.xgroup_destroy(stream, "half-sub")
            await until(
                lambda: (
                    isinstance(a.error, streamsub.SubscriptionNotFoundError)
                    and isinstance(b.error, streamsub.SubscriptionNotFoundError)
                ),
                20,
                "both subscribers to end",
            )
