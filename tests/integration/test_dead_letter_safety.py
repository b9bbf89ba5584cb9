"""Dead-lettering with many entries: each written once, and within flow control."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis

import streamsub
from streamsub._core.codec import encode
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND, stream_key
from tests._wait import until


async def test_dead_lettering_an_entry_twice_writes_it_once(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A retried dead_letter call, or one by a consumer that does not own the
    entry, writes nothing: 20 entries dead-lettered twice (and once more by a
    stranger) leave exactly 20 dead letters."""
    await client.create_topic("dl-src", partitions=1)
    await client.create_topic("dl-dst", partitions=1)
    await client.create_subscription("dl-sub", topic="dl-src", dead_letter_topic="dl-dst")
    await client.publish_many("dl-src", [f"m{i}".encode() for i in range(20)])
    backend = client._backend
    source = await backend.get_topic("dl-src")
    target = await backend.get_topic("dl-dst")
    assert source is not None
    assert target is not None
    entries = await backend.read(source, "dl-sub", "owner", [0], 20, None)
    assert len(entries) == 20
    written = []
    for entry in entries:
        packed = encode(b"dead", None, None, max_bytes=1000).packed
        for consumer in ("owner", "owner", "stranger"):
            written.append(
                await backend.dead_letter(
                    source, "dl-sub", consumer, 0, entry.entry_id, target, 0, packed, None, None
                )
            )
    assert sum(1 for w in written if w is not None) == 20
    assert written[1::3] == [None] * 20  # the retry
    assert written[2::3] == [None] * 20  # the stranger
    assert redis_client.xlen(stream_key(redis_client, "dl-dst", 0)) == 20
    assert redis_client.xpending(stream_key(redis_client, "dl-src", 0), "dl-sub")["pending"] == 0
    # Each holds the message it was given (data alone, packed as a run of one)
    # and its delivery times.
    for _, fields in redis_client.xrange(stream_key(redis_client, "dl-dst", 0)):
        assert fields.pop(b"d") == b"dead"
        assert sorted(fields) == [b"a:streamsub.first_delivery_ms", b"a:streamsub.last_delivery_ms"]


class _Probing(TEST_BACKEND):
    """Records, as each dead letter is written, what ``probe`` answers."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.probe: Callable[[], int] = lambda: -1
        self.seen: list[int] = []

    async def dead_letter(self, *args: Any, **kwargs: Any) -> str | None:
        self.seen.append(self.probe())
        return await super().dead_letter(*args, **kwargs)


async def test_exhausted_entries_take_flow_control_budget_until_dead_lettered(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """60 entries a crashed consumer held past their last attempt are dead-lettered
    within flow control: never more than max_messages outstanding, and counted
    while they wait; each is dead-lettered exactly once."""
    await client.create_topic("spent", partitions=2)
    await client.create_topic("spent-dl", partitions=1)
    await client.create_subscription(
        "spent-sub",
        topic="spent",
        ack_deadline=0.5,
        max_delivery_attempts=1,
        dead_letter_topic="spent-dl",
    )
    await client.publish_many(
        "spent",
        [streamsub.OutgoingMessage(data=b"x" * 1000, ordering_key=f"k{i}") for i in range(60)],
    )
    for partition in range(2):
        redis_client.xreadgroup(
            "spent-sub", "crashed", {stream_key(redis_client, "spent", partition): ">"}, count=100
        )
    seen_outstanding: list[int] = []

    async def never(message: streamsub.Message) -> None:
        raise AssertionError("an exhausted message reached the handler")

    flow = streamsub.FlowControl(max_messages=5)
    probing = _Probing(server.url)
    async with (
        streamsub.connect(backend=probing) as watched,
        watched.subscribe("spent-sub", never, flow_control=flow) as sub,
    ):
        probing.probe = lambda: sub.statistics().flow.outstanding_messages

        def done() -> bool:
            seen_outstanding.append(sub.statistics().flow.outstanding_messages)
            # Counted once acknowledged too: on a cluster the dead letter is
            # appended, then the source acknowledged, in two round trips.
            counted = sub.statistics().dead_lettered >= 60
            return counted and redis_client.xlen(dead_letters) >= 60

        dead_letters = stream_key(redis_client, "spent-dl", 0)
        await until(done, 20, "60 dead letters")
        assert sub.statistics().dead_lettered == 60
    assert redis_client.xlen(dead_letters) == 60
    assert max(seen_outstanding) <= 5
    # Each entry is counted in flow control while its dead letter is written.
    assert len(probing.seen) == 60
    assert min(probing.seen) >= 1, "exhausted entries were not counted in flow control"
    assert max(probing.seen) <= 5
    assert redis_client.xpending(stream_key(redis_client, "spent", 0), "spent-sub")["pending"] == 0


async def test_a_deleted_dead_letter_topic_stops_the_subscriber_instead_of_swallowing(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """With its dead-letter topic deleted, a subscriber that must dead-letter stops
    with TopicNotFoundError; nothing is written to a stream nobody reads, and the
    message stays pending for when the topic exists again."""
    await client.create_topic("dlgone", partitions=2)
    await client.create_topic("dlgone-dead", partitions=1)
    dead_stream = stream_key(redis_client, "dlgone-dead", 0)
    await client.create_subscription("dlgone-sub", topic="dlgone", dead_letter_topic="dlgone-dead")

    async def handler(message: streamsub.Message) -> None:
        message.dead_letter("poison")

    sub = client.subscribe("dlgone-sub", handler, ack_mode="manual")
    await sub.start()
    await client.delete_topic("dlgone-dead")  # while the subscriber runs
    await client.publish_many("dlgone", [f"m{i}".encode() for i in range(10)])
    with pytest.raises(streamsub.TopicNotFoundError):
        await asyncio.wait_for(sub.wait(), 10)
    await sub.stop()
    assert not redis_client.exists(dead_stream)
    pending = sum(
        redis_client.xpending(stream_key(redis_client, "dlgone", p), "dlgone-sub")["pending"]
        for p in range(2)
    )
    assert pending == 10


async def test_exactly_once_nacks_keep_delivery_times_for_dead_letters(
    client: streamsub.Client,
) -> None:
    """Messages nacked with nack_with_response until dead-lettered carry real first
    and last delivery times, the last no earlier than the first."""
    await client.create_topic("eonack", partitions=2)
    await client.create_topic("eonack-dead", partitions=1)
    await client.create_subscription(
        "eonack-sub",
        topic="eonack",
        dead_letter_topic="eonack-dead",
        max_delivery_attempts=2,
        enable_exactly_once_delivery=True,
        retry_policy=streamsub.RetryPolicy(minimum_backoff=0.1, maximum_backoff=0.1),
    )
    await client.publish_many("eonack", [f"m{i}".encode() for i in range(10)])

    async def handler(message: streamsub.Message) -> None:
        if message.delivery_attempt == 1:
            await message.nack_with_response()
        else:
            message.dead_letter("second failure")

    async with client.subscribe("eonack-sub", handler, ack_mode="manual") as sub:
        await until(lambda: sub.statistics().dead_lettered == 10, 10, "10 dead letters")
    letters = await client.list_dead_letters("eonack-sub")
    assert len(letters) == 10
    for letter in letters:
        assert letter.first_delivery is not None
        assert letter.last_delivery is not None
        assert letter.first_delivery.year >= 2025
        assert letter.last_delivery >= letter.first_delivery
