"""Dead-letter tools on a real Redis: list with metadata, replay, purge."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator

import pytest
import redis

import streamsub
from streamsub._backends.redis._keys import claims_key
from streamsub.testing import RedisServer
from tests._layout import backend_class, partition_tag, stream_keys
from tests._wait import until

PARTITIONS = 4


@pytest.fixture
async def client(server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[streamsub.Client]:
    """A client on an emptied server with a topic whose poison messages are dead-lettered."""
    redis_client.flushall()
    async with streamsub.connect(server.url, trim_in_background=False) as connected:
        await connected.create_topic("orders", partitions=PARTITIONS)
        await connected.create_topic("dead", partitions=2)
        await connected.create_subscription(
            "billing", topic="orders", dead_letter_topic="dead", max_delivery_attempts=2,
            ack_deadline=1, retry_policy=streamsub.RetryPolicy(minimum_backoff=0.01,
                                                               maximum_backoff=0.01),
        )  # fmt: skip
        await connected.create_subscription("audit", topic="orders", start="earliest")
        yield connected


async def _dead_letter(client: streamsub.Client, count: int) -> list[str]:
    """Publish ``count`` messages that the billing handler always refuses; return their
    ids once all are dead-lettered."""
    ids = await client.publish_many(
        "orders",
        [
            streamsub.OutgoingMessage(
                data=f"order-{i}".encode(), ordering_key=f"customer-{i % 7}",
                attributes={"n": str(i)},
            )
            for i in range(count)
        ],
    )  # fmt: skip

    async def refuse(message: streamsub.Message) -> None:
        raise RuntimeError(f"cannot bill {message.data!r}")

    async with client.subscribe("billing", refuse) as subscriber:
        await until(
            lambda: subscriber.statistics().dead_lettered == count, 30, f"{count} dead letters"
        )
    return ids


async def test_dead_letters_round_trip(client: streamsub.Client) -> None:
    """Dead-lettered messages are listed with their metadata, replayed to their topic,
    delivered again to the subscription, and gone from the dead-letter topic."""
    ids = await _dead_letter(client, 40)
    letters = await client.list_dead_letters("billing", limit=1000)

    assert len(letters) == 40
    assert {letter.source_message_id for letter in letters} == set(ids)
    assert {int(letter.message_id.split("-")[0]) for letter in letters} == {0, 1}
    for letter in letters:
        n = letter.attributes["n"]
        assert letter.data == f"order-{n}".encode()
        assert letter.ordering_key == f"customer-{int(n) % 7}"
        assert dict(letter.attributes) == {"n": n}
        assert (letter.source_topic, letter.source_subscription) == ("orders", "billing")
        assert letter.delivery_attempts == 2
        assert letter.reason is not None
        assert "cannot bill" in letter.reason
        assert letter.first_delivery is not None
        assert letter.last_delivery is not None
        assert letter.first_delivery <= letter.last_delivery
        assert letter.last_delivery <= datetime.datetime.now(datetime.UTC)
    assert await client.get_dead_letter("billing", letters[3].message_id) == letters[3]
    assert len(await client.list_dead_letters("billing", limit=5)) == 5

    replayed = await client.replay_dead_letters("billing")

    assert replayed == 40
    assert await client.list_dead_letters("billing") == []
    seen: dict[str, bytes] = {}

    async def accept(message: streamsub.Message) -> None:
        seen[message.attributes["n"]] = message.data

    async with client.subscribe("billing", accept):
        await until(lambda: len(seen) == 40, 30, "the 40 replayed messages")
    assert seen == {str(i): f"order-{i}".encode() for i in range(40)}


async def test_replay_to_another_topic_and_purge_selected(client: streamsub.Client) -> None:
    """Replay can target another topic and chosen ids; purge deletes the rest, each with a count."""
    await _dead_letter(client, 12)
    await client.create_topic("retry", partitions=2)
    await client.create_subscription("retrier", topic="retry")
    letters = await client.list_dead_letters("billing")
    chosen = [letter.message_id for letter in letters[:5]]

    assert await client.replay_dead_letters("billing", to="retry", message_ids=chosen) == 5
    remaining = await client.list_dead_letters("billing")
    assert [letter.message_id for letter in remaining] == [
        letter.message_id for letter in letters[5:]
    ]
    seen: list[str] = []

    async def accept(message: streamsub.Message) -> None:
        seen.append(message.attributes["n"])

    async with client.subscribe("retrier", accept):
        await until(lambda: len(seen) == 5, 30, "5 replayed messages on the other topic")
    assert sorted(seen) == sorted(letter.attributes["n"] for letter in letters[:5])

    assert await client.purge_dead_letters("billing") == 7
    assert await client.list_dead_letters("billing") == []
    assert await client.purge_dead_letters("billing") == 0


async def test_dead_letter_tools_need_a_dead_letter_topic(client: streamsub.Client) -> None:
    """Asking for the dead letters of a subscription without a dead-letter topic raises."""
    with pytest.raises(streamsub.FailedPreconditionError, match="no dead-letter topic"):
        await client.list_dead_letters("audit")
    with pytest.raises(streamsub.NotFoundError):
        await client.get_dead_letter("billing", "0-1-0")


async def test_tools_page_through_a_shared_dead_letter_topic(client: streamsub.Client) -> None:
    """Thousands of dead letters, mixed with another subscription's in one dead-letter
    topic, are listed oldest first, replayed and purged page by page, each exactly once."""
    await client.create_subscription("other", topic="orders", dead_letter_topic="dead")

    def letter(i: int, subscription: str) -> streamsub.OutgoingMessage:
        return streamsub.OutgoingMessage(
            data=f"{subscription}-{i}".encode(),
            attributes={
                "n": str(i),
                "streamsub.source_topic": "orders",
                "streamsub.source_subscription": subscription,
                "streamsub.delivery_attempts": "2",
                "streamsub.dead_letter_reason": "test",
            },
        )

    for start in range(0, 2500, 500):
        await client.publish_many(
            "dead",
            [letter(i, s) for i in range(start, start + 500) for s in ("billing", "other")],
        )
    first = await client.list_dead_letters("billing", limit=10)
    assert [d.attributes["n"] for d in first] == [str(i) for i in range(10)]

    assert await client.replay_dead_letters("billing", to="orders") == 2500
    assert await client.list_dead_letters("billing") == []
    assert len(await client.list_dead_letters("other", limit=10_000)) == 2500
    assert await client.purge_dead_letters("other") == 2500
    stats = await client.stats("orders")
    assert {s.subscription: s.dead_letter_topic_length for s in stats.subscriptions}["billing"] == 0
    assert sum(stats.topics[0].lengths) == 2500  # the replayed copies


def _orders_length(redis_client: redis.Redis) -> int:
    streams = stream_keys(redis_client, "orders", PARTITIONS)
    return sum(int(redis_client.xlen(key)) for key in streams)


async def test_concurrent_replays_publish_each_dead_letter_once(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Two replays of the same dead letters at once publish each exactly once,
    and their counts add up to what was published."""
    import asyncio

    await _dead_letter(client, 300)
    before = _orders_length(redis_client)
    counts = await asyncio.gather(
        client.replay_dead_letters("billing"), client.replay_dead_letters("billing")
    )
    assert sum(counts) == 300
    assert _orders_length(redis_client) == before + 300
    assert await client.list_dead_letters("billing") == []
    for p in range(2):  # one key per call: a cluster's keys of two slots
        assert redis_client.exists(claims_key(partition_tag(redis_client, "dead", p))) == 0


async def test_a_replay_retried_after_a_crash_publishes_again_only_after_the_claim_expired(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """Dead letters claimed by a replay that crashed before publishing are skipped
    by a retry while the claim lasts, and published once after it expired."""
    from streamsub._core.seek import split_message_id

    await _dead_letter(client, 100)
    letters = await client.list_dead_letters("billing", limit=1000)
    crashed = letters[:40]
    backend = backend_class(server.url)(server.url)
    try:
        topic = await backend.get_topic("dead")
        assert topic is not None
        ids: dict[int, list[str]] = {}
        for letter in crashed:
            partition, entry_id = split_message_id(letter.message_id)
            ids.setdefault(partition, []).append(entry_id)
        won = await backend.claim_entries(topic, ids, 0.5)  # then "crashes"
        assert sum(len(v) for v in won.values()) == 40
    finally:
        await backend.close()
    before = _orders_length(redis_client)
    assert await client.replay_dead_letters("billing") == 60
    assert _orders_length(redis_client) == before + 60
    assert [d.message_id for d in await client.list_dead_letters("billing")] == [
        d.message_id for d in crashed
    ]
    seconds, micros = redis_client.time()
    expired_at = int(seconds) * 1000 + int(micros) // 1000 + 500

    def claims_expired() -> bool:
        now_s, now_us = redis_client.time()
        return int(now_s) * 1000 + int(now_us) // 1000 > expired_at

    await until(claims_expired, 5, "the crashed replay's claims to expire")
    assert await client.replay_dead_letters("billing") == 40
    assert _orders_length(redis_client) == before + 100
