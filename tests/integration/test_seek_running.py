"""A seek to a time while subscribers run, plain and ordered."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._wait import until
from tests.integration.test_seek import _after_clock_moves

PARTITIONS = 4
KEYS = 40


async def _until_nothing_pending(client: streamsub.Client) -> None:
    """The acks counted (queued) have reached Redis: they leave in batches, so
    on a busy machine the last batch can still be on its way."""
    pending = 0

    async def check() -> bool:
        nonlocal pending
        pending = (await client.subscription_stats("billing")).pending
        return pending == 0

    for _ in range(100):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{pending} messages still pending 10 s after all were acked")


@pytest.fixture
async def client(server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[streamsub.Client]:
    """A client on an emptied server that trims only when a test asks it to."""
    redis_client.flushall()
    async with streamsub.connect(server.url, trim_in_background=False) as connected:
        yield connected


async def _publish(client: streamsub.Client, tag: str, per_key: int) -> list[str]:
    return await client.publish_many(
        "orders",
        [
            streamsub.OutgoingMessage(data=f"{tag}:{k}:{n}".encode(), ordering_key=f"key-{k}")
            for n in range(per_key)
            for k in range(KEYS)
        ],
    )


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_a_seek_to_a_time_under_two_running_subscribers_replays_exactly_what_follows(
    client: streamsub.Client, ordered: bool
) -> None:
    """Everything handled and acked by two running subscribers, then a seek to a
    time between two batches: exactly the later batch is handled again, on every
    partition, once each, and (ordered) each key again in publish order."""
    await client.create_topic("orders", partitions=PARTITIONS)
    await client.create_subscription(
        "billing", topic="orders", start="earliest", enable_message_ordering=ordered
    )
    before = await _publish(client, "before", 10)
    point = _after_clock_moves()
    after = await _publish(client, "after", 10)
    assert {m.split("-")[0] for m in after} == {str(p) for p in range(PARTITIONS)}
    handled: collections.Counter[str] = collections.Counter()
    order: dict[str, list[bytes]] = collections.defaultdict(list)

    async def handle(message: streamsub.Message) -> None:
        handled[message.message_id] += 1
        order[message.ordering_key].append(message.data)

    async with (
        client.subscribe("billing", handle, consumer="a") as one,
        client.subscribe("billing", handle, consumer="b") as two,
    ):
        total = len(before) + len(after)
        await until(
            lambda: one.statistics().acked + two.statistics().acked == total, 30, "all acked"
        )
        assert set(handled) == set(before) | set(after)
        assert all(n == 1 for n in handled.values())
        order.clear()
        await client.seek("billing", to=point)
        await until(
            lambda: one.statistics().acked + two.statistics().acked == total + len(after),
            30,
            "the later batch acked again",
        )
        await _until_nothing_pending(client)
    assert {m for m, n in handled.items() if n == 2} == set(after)
    assert {m for m, n in handled.items() if n == 1} == set(before)
    assert max(handled.values()) == 2
    if ordered:
        for key, datas in order.items():
            assert datas == [f"after:{key[4:]}:{n}".encode() for n in range(10)], key


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_a_seek_to_a_snapshot_under_running_subscribers_redelivers_as_documented(
    client: streamsub.Client, redis_client: redis.Redis, ordered: bool
) -> None:
    """README: a snapshot seek redelivers the messages pending when it was taken and
    every message after the last delivered id; with two subscribers running during
    the seek, exactly those are handled again, once each (ordered: each key in order)."""
    from tests._layout import stream_key

    await client.create_topic("orders", partitions=PARTITIONS)
    await client.create_subscription(
        "billing",
        topic="orders",
        start="earliest",
        enable_message_ordering=ordered,
        ack_deadline=1,
    )
    acked = await _publish(client, "acked", 5)
    handled: collections.Counter[str] = collections.Counter()
    order: dict[str, list[bytes]] = collections.defaultdict(list)

    async def handle(message: streamsub.Message) -> None:
        handled[message.message_id] += 1
        order[message.ordering_key].append(message.data)

    async with client.subscribe("billing", handle, consumer="a") as sub:
        await until(lambda: sub.statistics().acked == len(acked), 30, "the first batch acked")
    pending_then = await _publish(client, "pending", 2)
    for p in range(PARTITIONS):  # delivered to a consumer that vanished: pending
        redis_client.xreadgroup("billing", "gone", {stream_key(redis_client, "orders", p): ">"})
    unread = await _publish(client, "unread", 2)
    await client.create_snapshot("snap", "billing")
    later = await _publish(client, "later", 2)
    again = set(pending_then) | set(unread) | set(later)
    async with (
        client.subscribe("billing", handle, consumer="a") as one,
        client.subscribe("billing", handle, consumer="b") as two,
    ):
        # The vanished consumer's messages come back after the 1-s ack deadline.
        await until(lambda: set(handled) == set(acked) | again, 30, "all handled")
        await until(
            lambda: one.statistics().acked + two.statistics().acked == len(again),
            30,
            "all acked",
        )
        order.clear()
        base = one.statistics().acked + two.statistics().acked
        await client.seek("billing", to="snap")
        await until(
            lambda: one.statistics().acked + two.statistics().acked - base >= len(again),
            30,
            "the snapshot's messages acked again",
        )
        await _until_nothing_pending(client)
    assert {m for m, n in handled.items() if n >= 1} == set(acked) | again
    assert [m for m in acked if handled[m] != 1] == []
    assert {m: handled[m] for m in again if handled[m] != 2} == {}
    if ordered:
        for key, datas in order.items():
            k = key[4:]
            tags = ("pending", "unread", "later")
            expected = [f"{t}:{k}:{n}".encode() for t in tags for n in range(2)]
            assert datas == expected, key
