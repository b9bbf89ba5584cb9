"""A read at the server while its partition starts to be handed over.

When a newcomer joins, the owner gives back at once what waits unstarted in
the partitions it hands over, for the newcomer to take over in order. A read
it sent before the hand-over began (blocked at the server on an idle
partition) can still bring later messages of those keys: they must go back
too, not start here after the earlier ones went back (CI run: "152 handled
before 151" in the scale-out fault test, under load)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

import streamsub
from streamsub._core.partition import partition_for_key
from streamsub.testing import RedisServer
from tests._wait import until
from tests.ordered_faults._keys import Journal, index, keyed, ordered

PER_KEY = 10


@pytest.mark.timeout(60)
async def test_messages_a_read_brings_during_a_handover_keep_their_keys_order(
    client: streamsub.Client, server: RedisServer
) -> None:
    """Subscriber a owns both partitions; four keys of partition 1 (the
    newcomer's share) and two of partition 0 have message 0 running (held on a
    gate) and message 1 waiting, while a's reader waits at the server for more.
    Subscriber b joins; as soon as a stops reading partition 1 (the hand-over
    began, message 1 of its keys went back), messages 2-9 of every key are
    published: a's read, sent before the hand-over, brings those of partition
    1 too. Once the gate opens, every key's messages are first handled in
    publish order (before the fix: 0, 2, 3, …, 9 by a, then 1 by b), none
    twice at once."""
    await ordered(client, partitions=2)
    candidates = [f"k{i}" for i in range(200)]
    moving = [k for k in candidates if partition_for_key(k, 2) == 1][:4]
    staying = [k for k in candidates if partition_for_key(k, 2) == 0][:2]
    keys = moving + staying
    journal = Journal()
    gate = asyncio.Event()

    def recorder(who: str) -> Callable[[streamsub.Message], Awaitable[None]]:
        return journal.gated(who, gate, lambda m: index(m) == 0 and m.delivery_attempt == 1)

    other = streamsub.connect(server.url)
    try:
        async with client.subscribe("billing", recorder("a"), consumer="a") as first:
            await until(lambda: len(first.statistics().partitions) == 2, 15, "a to own both")
            await client.publish_many("orders", keyed(keys, 0, 2))
            await until(
                lambda: (
                    first.statistics().running == len(keys)
                    and first.statistics().held_for_order == len(keys)
                ),
                15,
                "message 0 of every key running, message 1 waiting",
            )
            # The reader, with room, now waits at the server (up to 1 s a read).
            async with other.subscribe("billing", recorder("b"), consumer="b"):
                await until(
                    lambda: first.statistics().partitions == (0,),
                    15,
                    "a to start handing partition 1 over",
                )
                await client.publish_many("orders", keyed(keys, 2, PER_KEY))
                # a's read in flight has partition 1's messages 2-9 by now, or never.
                await asyncio.sleep(0.3)
                gate.set()
                await until(lambda: journal.distinct() == len(keys) * PER_KEY, 20, "every message")
    finally:
        gate.set()
        await other.aclose()
    assert journal.out_of_order(PER_KEY) == {}
    assert journal.most_at_once_per_key == 1
    handled_by_b = {key for key, _, _, who in journal.records if who == "b"}
    assert handled_by_b == set(moving), "b took over partition 1's keys"
