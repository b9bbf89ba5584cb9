"""Operator statistics on a real Redis, checked against known traffic."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._layout import backend_class, stream_key

PARTITIONS = 4
PER_PARTITION = 40


@pytest.fixture
async def client(server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[streamsub.Client]:
    """A client on an emptied server that trims only when a test asks it to."""
    redis_client.flushall()
    async with streamsub.connect(server.url, trim_in_background=False) as connected:
        yield connected


async def make_known_traffic(client: streamsub.Client, redis_client: redis.Redis) -> list[str]:
    """160 messages over 4 partitions; billing holds 10, 10, 5, 5 of them (consumers c1
    and c2, 3 delivered twice); audit has read nothing; 3 entries in billing's
    dead-letter topic."""
    await client.create_topic("orders", partitions=PARTITIONS)
    await client.create_topic("dead", partitions=2)
    await client.create_subscription("billing", topic="orders", dead_letter_topic="dead")
    await client.create_subscription("audit", topic="orders")
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < PARTITIONS:
        keys.setdefault(streamsub.fnv1a_32(f"k{i}".encode()) % PARTITIONS, f"k{i}")
        i += 1
    ids = await client.publish_many(
        "orders",
        [
            streamsub.OutgoingMessage(data=b"x" * 100, ordering_key=keys[p])
            for _ in range(PER_PARTITION)
            for p in range(PARTITIONS)
        ],
    )
    for p, consumer, count in ((0, "c1", 10), (1, "c1", 10), (2, "c2", 5), (3, "c2", 5)):
        redis_client.xreadgroup(
            "billing", consumer, {stream_key(redis_client, "orders", p): ">"}, count=count
        )
    first = [
        e["message_id"]
        for e in redis_client.xpending_range(
            stream_key(redis_client, "orders", 0), "billing", "-", "+", 3
        )
    ]
    redis_client.xclaim(stream_key(redis_client, "orders", 0), "billing", "c1", 0, first)
    await client.publish_many("dead", [b"a", b"b", b"c"])
    return ids


async def test_stats_report_known_traffic(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """stats() reports each topic's length, memory and publish rate, and each
    subscription's backlog, pending per partition and consumer, delivery attempts,
    oldest unacknowledged age and dead-letter depth, as the traffic made them."""
    started = time.time()
    ids = await make_known_traffic(client, redis_client)
    stats = await client.stats("orders")

    (topic,) = stats.topics
    assert topic.topic == "orders"
    assert topic.length == 160
    assert topic.lengths == (40, 40, 40, 40)
    assert topic.memory_bytes is not None
    assert topic.memory_bytes > 160 * 100
    assert topic.publish_rate == pytest.approx(160 / 10)
    assert topic.dropped_unacked == 0

    audit, billing = stats.subscriptions
    assert (billing.subscription, billing.topic) == ("billing", "orders")
    assert billing.pending == 30
    assert billing.backlog == 130
    assert [(p.partition, p.backlog, p.pending) for p in billing.partitions] == [
        (0, 30, 10),
        (1, 30, 10),
        (2, 35, 5),
        (3, 35, 5),
    ]
    assert billing.pending_per_consumer == {"c1": 20, "c2": 10}
    assert billing.delivery_attempts == {1: 27, 2: 3}
    assert billing.dead_letter_topic_length == 3
    oldest_ms = min(int(i.split("-")[1]) for i in ids)
    assert billing.oldest_unacked_age is not None
    assert billing.oldest_unacked_age == pytest.approx(time.time() - oldest_ms / 1000, abs=1.0)
    assert billing.oldest_unacked_age <= time.time() - started + 1

    assert (audit.backlog, audit.pending, audit.dead_letter_topic_length) == (160, 0, None)
    assert audit.pending_per_consumer == {}
    assert audit.delivery_attempts == {}


async def test_stats_count_retention_losses(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A topic's stats show how many unacknowledged messages its hard cap dropped."""
    await make_known_traffic(client, redis_client)
    await client.update_topic_retention(
        "orders", streamsub.Retention(max_length=15, drop_unacked=True)
    )
    result = await client.enforce_retention("orders")
    stats = await client.stats()
    orders = next(t for t in stats.topics if t.topic == "orders")
    # Each partition drops 25 entries, every one unacknowledged by audit.
    assert result.dropped_unacked == 100
    assert orders.dropped_unacked == 100
    assert orders.lengths == (15, 15, 15, 15)
    assert [t.topic for t in stats.topics] == ["dead", "orders"]
    # What is left is all undelivered to both: the backlog counts it, not what
    # the cap dropped (Redis 7.0's lag still counts billing's dropped entries).
    for report in stats.subscriptions:
        assert [p.backlog for p in report.partitions] == [15] * PARTITIONS, report.subscription
        assert report.pending == 0


async def test_stats_read_a_bounded_sample_and_age_by_the_server_clock(
    client: streamsub.Client,
    redis_client: redis.Redis,
    server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a busy topic the publish rate reads at most the newest 1,000 entries per
    partition (over the time they span); a backlog with no lag from the server
    is the stream's length when nothing was delivered; ages follow the server's
    clock even when the client's runs an hour ahead."""
    from streamsub._core.stats import ATTEMPT_SAMPLE, BACKLOG_CAP, RATE_SAMPLE, RATE_WINDOW

    await client.create_topic("busy", partitions=PARTITIONS)
    await client.create_subscription("reader", topic="busy", start="earliest")
    total = PARTITIONS * 2500
    for start in range(0, total, 5000):
        await client.publish_many("busy", [f"m{i}".encode() for i in range(start, start + 5000)])
    for p in range(PARTITIONS):  # a deletion makes Redis 7 report no lag
        first = redis_client.xrange(stream_key(redis_client, "busy", p), count=1)[0][0]
        redis_client.xdel(stream_key(redis_client, "busy", p), first)
    backend = backend_class(server.url)(server.url)
    try:
        topic = await backend.get_topic("busy")
        assert topic is not None
        counts = await backend.partition_counts(
            topic,
            window=RATE_WINDOW,
            rate_sample=RATE_SAMPLE,
            sample=ATTEMPT_SAMPLE,
            backlog_cap=BACKLOG_CAP,
        )
    finally:
        await backend.close()
    assert all(c.recent == RATE_SAMPLE and 0 < c.recent_span < RATE_WINDOW for c in counts)
    assert [c.groups[0].backlog for c in counts] == [c.length for c in counts]

    import streamsub._client as client_module

    class Ahead:
        @staticmethod
        def time() -> float:
            return time.time() + 3600

    monkeypatch.setattr(client_module, "time", Ahead)
    stats = await client.stats("busy")
    reader = stats.subscriptions[0]
    assert reader.backlog == total - PARTITIONS
    assert reader.oldest_unacked_age is not None
    assert reader.oldest_unacked_age < 600
    assert stats.topics[0].publish_rate > 0
