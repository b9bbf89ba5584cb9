"""Shared by the lost-read-reply tests (standalone and cluster): an ordered read
that the server runs and whose reply it drops with the connection.

The connection is closed by the server itself, deterministically: a reply above
``client-output-buffer-limit`` for normal clients is never sent, and the client
is disconnected after its command ran. A reply above 16 KB takes whole 16-KB
blocks, so the limit leaves room for those."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis

import streamsub
from tests._wait import until
from tests.ordered_faults._keys import Journal

KEYS = [f"key-{k}" for k in range(4)]
ROUNDS = 10
LIMIT = 65536
"""Bytes: the hard output-buffer limit of normal clients while the test holds it."""


def _messages(first: int, last: int) -> list[streamsub.OutgoingMessage]:
    """Rounds ``first``..``last-1`` of every key; key-0's round 1 is 200 KB."""
    return [
        streamsub.OutgoingMessage(
            data=f"{key}:{n}:".encode() + (b"x" * 200_000 if (key, n) == (KEYS[0], 1) else b""),
            ordering_key=key,
        )
        for n in range(first, last)
        for key in KEYS
    ]


async def first_handlings_after_a_lost_reply(
    url: str, node_of_partition: Callable[[], redis.Redis]
) -> dict[str, list[int]]:
    """An ordered subscription of a one-partition topic (one owner reads it); 4
    keys, 10 rounds. Once round 0 is handled, the partition's node (from
    ``node_of_partition``, called once the topic exists) gets the output limit
    and round 1 is published: the read that takes it runs (its 4 entries
    pending) and its reply is dropped. Then the other rounds are published, and
    2 s later the limit is lifted. Per key, the rounds in the order first
    handled, once every message was handled."""
    journal = Journal()

    async def handler(message: streamsub.Message) -> None:
        journal.enter(message)
        journal.leave(message)

    async with streamsub.connect(url) as client:
        await client.create_topic("lost", partitions=1)
        await client.create_subscription(
            "lost-sub", topic="lost", enable_message_ordering=True, ack_deadline=5.0
        )
        record = await client._backend.get_topic("lost")
        assert record is not None
        stream = client._backend._keys(record)[0]  # type: ignore[attr-defined]
        node = node_of_partition()
        try:
            async with client.subscribe("lost-sub", handler, consumer="s"):
                await client.publish_many("lost", _messages(0, 1))
                await until(lambda: journal.distinct() == len(KEYS), 30, "round 0 handled")
                node.config_set("client-output-buffer-limit", f"normal {LIMIT} 0 0")
                await client.publish_many("lost", _messages(1, 2))
                # The read that takes round 1 ran at the server (pending there)
                # and its reply was dropped: none of it handled.
                await until(
                    lambda: node.xpending(stream, "lost-sub")["pending"] == len(KEYS),
                    10,
                    "round 1 read",
                )
                assert journal.distinct() == len(KEYS)
                await client.publish_many("lost", _messages(2, ROUNDS))
                await asyncio.sleep(2.0)
                node.config_set("client-output-buffer-limit", "normal 0 0 0")
                await until(
                    lambda: journal.distinct() == len(KEYS) * ROUNDS, 45, "every message handled"
                )
        finally:
            node.config_set("client-output-buffer-limit", "normal 0 0 0")
            node.close()
    return journal.first_handlings()
