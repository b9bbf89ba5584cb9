"""One log line per noteworthy event, under the ``streamsub`` logger: a dead
letter and a lost lease, for each of many messages over several partitions."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
import redis

import streamsub
from streamsub import Message
from tests._layout import stream_key
from tests._wait import until


def _lines(caplog: pytest.LogCaptureFixture, pattern: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "streamsub"
        and r.levelno == logging.WARNING
        and re.search(pattern, r.getMessage())
    ]


async def test_each_dead_letter_is_logged_once_with_its_message_and_topic(
    client: streamsub.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """12 messages over 3 partitions, each dead-lettered by its handler: 12
    warnings, one per message id, each naming the dead-letter topic."""
    caplog.set_level(logging.WARNING, logger="streamsub")
    await client.create_topic("bills", partitions=3)
    await client.create_topic("bills-dead")
    await client.create_subscription("bills-sub", topic="bills", dead_letter_topic="bills-dead")
    ids = await client.publish_many("bills", [f"bill {i}".encode() for i in range(12)])

    async def refuse(message: Message) -> None:
        await message.dead_letter("cannot bill")

    async with client.subscribe("bills-sub", refuse) as sub:
        await until(lambda: sub.statistics().dead_lettered == 12, 10, "12 dead letters")
    lines = _lines(caplog, r"went to dead-letter topic 'bills-dead'")
    logged = sorted(re.search(r"message (\S+) of", line).group(1) for line in lines)  # type: ignore[union-attr]
    assert logged == sorted(ids)


async def test_each_lease_taken_by_another_consumer_is_logged_once(
    client: streamsub.Client, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """10 messages over 2 partitions held by running handlers; another consumer
    claims them all: the subscriber's next lease extension finds each gone and
    logs one "lease lost" warning per message."""
    caplog.set_level(logging.WARNING, logger="streamsub")
    await client.create_topic("held", partitions=2)
    await client.create_subscription("held-sub", topic="held", ack_deadline=2.0)
    ids = await client.publish_many("held", [f"m{i}".encode() for i in range(10)])
    release = asyncio.Event()
    running: list[str] = []

    async def hold(message: Message) -> None:
        running.append(message.message_id)
        await release.wait()

    async with client.subscribe("held-sub", hold):
        await until(lambda: len(running) == 10, 5, "10 running handlers")
        for message_id in ids:
            partition, entry_id = message_id.split("-", 1)
            stream = stream_key(redis_client, "held", int(partition))
            assert redis_client.xclaim(stream, "held-sub", "thief", 0, [entry_id])
        await until(lambda: len(_lines(caplog, "lease lost")) >= 10, 10, "10 lost leases")
        release.set()
    lines = _lines(caplog, "lease lost")
    logged = sorted(re.search(r"message (\S+) of", line).group(1) for line in lines)  # type: ignore[union-attr]
    assert logged == sorted(ids)
