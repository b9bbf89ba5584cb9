"""An ordered subscription's read whose reply is lost with its connection, on a
Redis Cluster (issue 9, "Done when": the ordering tests on a cluster; What to
build 3: a closed socket is retried). The server ran the fenced read
(read_owned.lua: XREADGROUP ``>``), so its entries are pending for the
subscriber, unseen; then the connection closed before the reply left. The
reader's rule (``_engine/reader.py``): a read whose outcome is unknown is
followed by taking back what is pending there before reading on, so that no
later message of those keys overtakes them. Here the connection is closed by
the server itself, deterministically: a reply above the node's
``client-output-buffer-limit`` for normal clients is never sent, and the
client is disconnected after the command ran."""

from __future__ import annotations

import asyncio

import pytest

import streamsub
from streamsub._backends.redis import _keys
from streamsub.testing import RedisClusterServers
from tests._wait import until
from tests.cluster._helpers import owner_port, partition_slot
from tests.ordered_faults._keys import Journal

KEYS = [f"key-{k}" for k in range(4)]
ROUNDS = 10
LIMIT = 65536
"""Bytes: the hard output-buffer limit of normal clients on the partition's master."""


@pytest.mark.timeout(90)
async def test_a_read_reply_lost_with_its_connection_lets_no_later_message_of_its_keys_overtake(
    emptied: RedisClusterServers,
) -> None:
    """An ordered subscription of a one-partition topic (one owner reads it); 4
    keys, 10 messages each, all small but key-0's second (200 KB). Once the
    first round is handled, the partition's master closes a normal client whose
    replies exceed 64 KB (a reply above 16 KB takes a whole 16-KB block, so
    that much stays free) and the second round is published: the read that
    takes it is run by the server (its 4 entries pending) and its reply
    dropped with the connection. Then the other rounds are published, and 2 s
    later the limit is lifted. Every message is then handled, and each key's first
    handlings are in publish order."""
    cluster = emptied
    journal = Journal()

    async def handler(message: streamsub.Message) -> None:
        journal.enter(message)
        journal.leave(message)

    def messages(first: int, last: int) -> list[streamsub.OutgoingMessage]:
        return [
            streamsub.OutgoingMessage(
                data=f"{key}:{n}:".encode() + (b"x" * 200_000 if (key, n) == (KEYS[0], 1) else b""),
                ordering_key=key,
            )
            for n in range(first, last)
            for key in KEYS
        ]

    async with streamsub.connect(cluster.url) as client:
        await client.create_topic("lost", partitions=1)
        await client.create_subscription(
            "lost-sub", topic="lost", enable_message_ordering=True, ack_deadline=5.0
        )
        record = await client._backend.get_topic("lost")
        assert record is not None
        stream = _keys.stream_key(_keys.partition_tag("lost", 0, record.salts[0]))
        master = cluster.node(owner_port(cluster, partition_slot(cluster, "lost", 0)))
        inspect = cluster.node(owner_port(cluster, partition_slot(cluster, "lost", 0)))
        try:
            async with client.subscribe("lost-sub", handler, consumer="s"):
                await client.publish_many("lost", messages(0, 1))
                await until(lambda: journal.distinct() == len(KEYS), 30, "the first round handled")
                master.config_set("client-output-buffer-limit", f"normal {LIMIT} 0 0")
                await client.publish_many("lost", messages(1, 2))
                # The read that takes them ran at the server (pending there),
                # and its reply was dropped: none of them handled.
                await until(
                    lambda: inspect.xpending(stream, "lost-sub")["pending"] == len(KEYS),
                    10,
                    "the second round read",
                )
                assert journal.distinct() == len(KEYS)
                await client.publish_many("lost", messages(2, ROUNDS))
                # A read that takes the big message is dropped until the limit is lifted.
                await asyncio.sleep(2.0)
                master.config_set("client-output-buffer-limit", "normal 0 0 0")
                await until(
                    lambda: journal.distinct() == len(KEYS) * ROUNDS, 45, "every message handled"
                )
        finally:
            master.config_set("client-output-buffer-limit", "normal 0 0 0")
            master.close()
            inspect.close()
    order = journal.first_handlings()
    wrong = {key: ns for key, ns in order.items() if ns != sorted(ns)}
    assert not wrong, f"later messages overtook a message whose read reply was lost: {wrong}"
