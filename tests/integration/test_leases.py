"""Leases and delayed redelivery with many messages per partition and two subscribers.

Every test here holds or nacks many messages at once: the bugs these guard
against (an extension or a delay refresh that reached only the first of many
entries) did not show with one message.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

import pytest
import redis

import streamsub
from streamsub import Message, RetryPolicy
from streamsub._backends.base import NackItem
from streamsub.testing import RedisServer
from tests._layout import backend_class, command_calls, reset_stats, stream_key
from tests._wait import until


async def test_a_second_subscriber_takes_none_of_twenty_slow_messages(
    client: streamsub.Client,
) -> None:
    """20 messages on one partition handled for 3.5 s each under a 1 s ack deadline:
    a second subscriber joining meanwhile receives none, and every attempt is 1."""
    await client.create_topic("slow", partitions=1)
    await client.create_subscription("slow-sub", topic="slow", ack_deadline=1.0)
    await client.publish_many("slow", [f"m{i}".encode() for i in range(20)])
    first: list[Message] = []
    second: list[Message] = []

    async def slow(message: Message) -> None:
        first.append(message)
        await asyncio.sleep(3.5)

    async def greedy(message: Message) -> None:
        second.append(message)

    async with client.subscribe("slow-sub", slow, consumer="first") as sub:
        await until(lambda: len(first) == 20, 5, "the first subscriber to hold all 20")
        async with client.subscribe("slow-sub", greedy, consumer="second"):
            await until(lambda: sub.statistics().acked == 20, 10, "the first to ack all 20")
            await asyncio.sleep(1.5)  # a reclaim sweep after the acks would find leftovers
    assert second == [], f"the second subscriber took {[m.message_id for m in second]}"
    assert [m.delivery_attempt for m in first] == [1] * 20


async def test_ten_delayed_nacks_each_come_back_once_after_the_backoff(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """10 messages nacked together with a 4 s backoff under a 1 s ack deadline, two
    subscribers: each comes back exactly once, at least 4 s later, as attempt 2;
    while they wait nobody refreshes them (their idle time grows)."""
    await client.create_topic("later", partitions=2)
    await client.create_subscription(
        "later-sub",
        topic="later",
        ack_deadline=1.0,
        retry_policy=RetryPolicy(minimum_backoff=4.0, maximum_backoff=4.0),
    )
    ids = await client.publish_many(
        "later",
        [
            streamsub.OutgoingMessage(data=f"m{i}".encode(), ordering_key=f"k{i % 2}")
            for i in range(10)
        ],
    )
    nacked_at: dict[str, float] = {}
    deliveries: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)

    async def handler(message: Message) -> None:
        deliveries[message.message_id].append((message.delivery_attempt, time.monotonic()))
        if message.delivery_attempt == 1:
            nacked_at[message.message_id] = time.monotonic()
            message.nack()
        else:
            message.ack()

    async with (
        client.subscribe("later-sub", handler, ack_mode="manual", consumer="one"),
        client.subscribe("later-sub", handler, ack_mode="manual", consumer="two"),
    ):
        await until(lambda: len(nacked_at) == 10, 5, "all ten nacked")
        await asyncio.sleep(2.6)
        for partition in range(2):
            pending = redis_client.xpending_range(
                stream_key(redis_client, "later", partition), "later-sub", "-", "+", 100
            )
            idle = [p["time_since_delivered"] for p in pending]
            assert idle, "the nacked messages must be pending"
            assert min(idle) >= 2000, f"waiting nacks were refreshed: {idle}"
        await until(lambda: sum(len(d) for d in deliveries.values()) == 20, 8, "ten redeliveries")
        await asyncio.sleep(2.5)  # a leftover delay record would bring one back again
    assert sorted(deliveries) == sorted(ids)
    for message_id, seen in deliveries.items():
        assert [attempt for attempt, _ in seen] == [1, 2], (message_id, seen)
        assert seen[1][1] - nacked_at[message_id] >= 4.0, (message_id, seen)


async def test_modify_ack_deadline_zero_ignores_the_retry_backoff(
    client: streamsub.Client,
) -> None:
    """modify_ack_deadline(0) redelivers at once even when the retry policy's
    backoff is 30 s: it is Pub/Sub's nack, not a failure."""
    await client.create_topic("modack", partitions=2)
    await client.create_subscription(
        "modack-sub",
        topic="modack",
        ack_deadline=2.0,
        retry_policy=RetryPolicy(minimum_backoff=30.0, maximum_backoff=60.0),
    )
    await client.publish_many("modack", [f"m{i}".encode() for i in range(20)])
    attempts: dict[bytes, list[int]] = collections.defaultdict(list)

    def handler(message: Message) -> None:
        attempts[message.data].append(message.delivery_attempt)
        if message.delivery_attempt == 1:
            message.modify_ack_deadline(0)
        else:
            message.ack()

    async with client.subscribe("modack-sub", handler, ack_mode="manual"):
        await until(
            lambda: len(attempts) == 20 and all(a == [1, 2] for a in attempts.values()),
            30.0 / 2,
            "every message redelivered well before the 30 s backoff",
        )


async def test_a_late_nack_of_an_old_delivery_leaves_the_new_one_alone(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A nack naming delivery 1 of an entry that was delivered again since (to the
    same consumer) changes nothing: the newer delivery keeps its lease."""
    topic = await client.create_topic("late", partitions=1)
    await client.create_subscription("late-sub", topic="late", ack_deadline=30.0)
    await client.publish_many("late", [f"m{i}".encode() for i in range(20)])
    backend = client._backend
    record = await backend.get_topic(topic.name)
    assert record is not None
    entries = await backend.read(record, "late-sub", "c", [0], 20, None)
    assert len(entries) == 20
    # Delivered again to the same consumer: delivery count 2.
    found, _ = await backend.reclaim(record, "late-sub", "c", {0: "-"}, 0, 100, 0)
    assert [item.entry.delivery_count for item in found] == [2] * 20
    items = {0: [NackItem(e.entry_id, 0, 0, 1, True) for e in entries]}
    given = await backend.nack(record, "late-sub", "c", items, 30_000)
    assert given == {0: []}
    pending = redis_client.xpending_range(
        stream_key(redis_client, "late", 0), "late-sub", "-", "+", 100
    )
    assert [p["times_delivered"] for p in pending] == [2] * 20
    assert max(p["time_since_delivered"] for p in pending) < 5_000  # not made idle


async def test_a_crashed_consumers_messages_come_back_while_a_long_nack_waits(
    client: streamsub.Client, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A nack waiting out a 30 s backoff does not pause the sweeps: 20 messages a
    vanished consumer held (1 s ack deadline) come back long before that backoff
    ends."""
    await client.create_topic("orphans", partitions=2)
    await client.create_subscription(
        "orphans-sub",
        topic="orphans",
        ack_deadline=1.0,
        retry_policy=RetryPolicy(minimum_backoff=30.0, maximum_backoff=30.0),
    )
    await client.publish_many("orphans", [f"m{i}".encode() for i in range(20)])
    for partition in range(2):  # a consumer that read them and died
        redis_client.xreadgroup(
            "orphans-sub",
            "crashed",
            {stream_key(redis_client, "orphans", partition): ">"},
            count=100,
        )
    read_at = time.monotonic()
    await client.publish("orphans", b"poison", ordering_key="p")
    seen: list[bytes] = []

    async def handler(message: Message) -> None:
        seen.append(message.data)
        if message.data == b"poison":
            raise ValueError("always fails")

    with caplog.at_level(logging.INFO, logger="streamsub"):
        async with client.subscribe("orphans-sub", handler) as sub:
            await until(lambda: sub.statistics().nacked == 1, 10, "the poison message nacked")
            await until(lambda: len(seen) == 21, 15, "the crashed consumer's 20 messages")
    # Half the nack's 30 s backoff, however busy the machine: the sweeps went on.
    assert time.monotonic() - read_at < 30.0 / 2
    assert any("took over" in r.getMessage() for r in caplog.records), "no reclaim was logged"


async def test_messages_acked_while_their_lease_is_extended_are_not_reported_lost(
    client: streamsub.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """With one subscriber nobody can take a message, so no lease is reported lost,
    even when thousands are acked while extensions are on their way (leases
    extended every 0.1 s)."""
    caplog.set_level(logging.WARNING, logger="streamsub")
    await client.create_topic("busy", partitions=4)
    await client.create_subscription("busy-sub", topic="busy", ack_deadline=0.3)
    await client.publish_many("busy", [f"m{i}".encode() for i in range(5000)])

    async def handler(message: Message) -> None:
        await asyncio.sleep(0.05 + (hash(message.data) % 100) / 1000)

    async with client.subscribe("busy-sub", handler) as sub:
        await until(lambda: sub.statistics().acked == 5000, 30, "5000 acked")
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert lost == []


async def test_an_ack_that_reaches_the_server_late_does_not_bring_the_message_back(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Acks that take 4.5 s to reach Redis (over twice the 2 s ack deadline), 20
    messages on two partitions and two subscribers: the acked messages stay
    leased until the ack lands, so none is handled twice, by the same subscriber
    or the other."""
    redis_client.flushall()

    class SlowAcks(backend_class(server.url)):  # type: ignore[misc]
        async def ack(self, *args: Any, **kwargs: Any) -> int:
            await asyncio.sleep(4.5)
            return await super().ack(*args, **kwargs)

    handled: collections.Counter[bytes] = collections.Counter()

    async def handler(message: Message) -> None:
        handled[message.data] += 1

    async with streamsub.Client(SlowAcks(server.url)) as client:
        await client.create_topic("lateack", partitions=2)
        await client.create_subscription("lateack-sub", topic="lateack", ack_deadline=2.0)
        await client.publish_many(
            "lateack",
            [
                streamsub.OutgoingMessage(data=f"m{i}".encode(), ordering_key=f"k{i}")
                for i in range(20)
            ],
        )
        async with (
            client.subscribe("lateack-sub", handler, consumer="one") as one,
            client.subscribe("lateack-sub", handler, consumer="two"),
        ):
            await until(lambda: len(handled) == 20, 5, "all 20 handled")
            await asyncio.sleep(6.0)  # past the slow ack and several sweeps
            assert one.statistics().reclaimed == 0
    assert set(handled.values()) == {1}, handled
    assert all(
        redis_client.xpending(stream_key(redis_client, "lateack", p), "lateack-sub")["pending"] == 0
        for p in range(2)
    )


async def test_waiting_delayed_nacks_cost_sweeps_no_lookups(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """300 nacks waiting out a 60 s backoff under a 0.4 s ack deadline: the sweeps
    that run meanwhile (one per 0.1 s) pass over them without a lookup each (no
    ZSCORE) and in at most a few pages per partition, not one page per 5 entries
    as a flow-control budget of 5 would make it."""
    await client.create_topic("parked", partitions=2)
    await client.create_subscription(
        "parked-sub",
        topic="parked",
        ack_deadline=0.4,
        retry_policy=RetryPolicy(minimum_backoff=60.0, maximum_backoff=60.0),
    )
    await client.publish_many("parked", [f"m{i}".encode() for i in range(300)])

    async def handler(message: Message) -> None:
        message.nack()

    flow = streamsub.FlowControl(max_messages=5)
    async with client.subscribe("parked-sub", handler, ack_mode="manual", flow_control=flow) as sub:
        await until(lambda: sub.statistics().nacked == 300, 20, "300 nacked")
        await asyncio.sleep(0.5)
        reset_stats(redis_client)
        await asyncio.sleep(2.0)  # about twenty sweeps
        # At least ten (partition) sweep starts, however slowly they came.
        await until(
            lambda: command_calls(redis_client).get("cmdstat_zrangebyscore", 0) >= 10,
            30,
            "ten sweeps",
        )
        calls = command_calls(redis_client)
    assert calls.get("cmdstat_zscore", 0) == 0
    sweeps_times_partitions = calls["cmdstat_zrangebyscore"]  # one per sweep start
    assert sweeps_times_partitions >= 10
    assert calls["cmdstat_xpending"] <= 3 * sweeps_times_partitions
    assert sub.statistics().reclaimed == 0
