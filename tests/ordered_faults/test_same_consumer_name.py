"""Two subscribers of an ordered subscription under one consumer name (two pods
given the same ``consumer=``, a copy-pasted worker config, a StatefulSet pod
started again while the old one still drains).

Ownership is keyed by the consumer name, so both heartbeats renew the same
member's partitions and both read them: either the second must be refused with
a clear error, or the partitions must still have one reader each."""

from __future__ import annotations

import asyncio

import pytest

import streamsub
from streamsub._engine.reader import READ_BLOCK_MS
from streamsub.testing import RedisServer
from tests._wait import until
from tests.ordered_faults._keys import Journal, keyed, ordered

KEYS = 20
PER_KEY = 40


@pytest.mark.timeout(60)
async def test_a_second_subscriber_with_the_same_consumer_name_takes_the_name_over(
    client: streamsub.Client, server: RedisServer, short_ownership_lease: float
) -> None:
    """Two clients subscribe to one ordered subscription, both as consumer "worker"
    (a restarted process, or a mistake): the second takes the name over, with its
    partitions under new fencing tokens, as Kafka's static members do, and the
    first is fenced at its next heartbeat: it owns and reads nothing more (a read
    it had at the server ends within its one-second block). From then on no
    partition is read by both, no key runs two handlers at once, and
    each key's first handlings are in publish order."""
    await ordered(client, partitions=2)
    journal = Journal()
    overlaps: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    other = streamsub.connect(server.url)
    try:
        async with client.subscribe(
            "billing", journal.handler("first", 0.003), consumer="worker"
        ) as first:
            await until(lambda: len(first.statistics().owned) == 2, 15, "first to own both")
            async with other.subscribe(
                "billing", journal.handler("second", 0.003), consumer="worker"
            ) as second:
                await until(lambda: len(second.statistics().partitions) == 2, 15, "the take-over")
                await until(lambda: not first.statistics().owned, 15, "first to be fenced")
                # A read the first had at the server then ends within its block.
                await asyncio.sleep(READ_BLOCK_MS / 1000 + 0.2)
                for n in range(0, PER_KEY, 5):
                    keys = [f"k{k}" for k in range(KEYS)]
                    await client.publish_many("orders", keyed(keys, n, n + 5))
                    both = set(first.statistics().partitions) & set(second.statistics().partitions)
                    if both:
                        overlaps.append(
                            (first.statistics().partitions, second.statistics().partitions)
                        )
                    await asyncio.sleep(0.05)
                await until(lambda: journal.distinct() == KEYS * PER_KEY, 30, "every message")
                assert first.statistics().received == 0
    finally:
        await other.aclose()
    assert not overlaps, f"both subscribers read the same partitions: {overlaps[:3]}"
    assert journal.most_at_once_per_key == 1
    assert not journal.out_of_order(PER_KEY)
