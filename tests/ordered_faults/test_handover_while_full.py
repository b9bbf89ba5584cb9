"""A hand-over while flow control is full with another partition's messages.

A sweep that started before the hand-over may wait for flow-control room
(held by a slow key of a partition that stays) before it sends anything: it
has nothing of the partition being handed over at the server, so it must not
hold the move until that slow handler ends (before the fix: the partition
counted as busy while the sweep waited, and the newcomer got nothing until
the slow key's handler returned)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

import streamsub
from streamsub._core.partition import partition_for_key
from streamsub.testing import RedisServer
from tests._wait import until
from tests.ordered_faults._keys import Journal, index, keyed, ordered

PER_KEY = 20


@pytest.mark.timeout(60)
async def test_a_sweep_waiting_for_room_does_not_hold_a_handover(
    client: streamsub.Client, server: RedisServer
) -> None:
    """Subscriber a (max_messages=4, ack deadline 1 s: it sweeps every 0.25 s)
    owns both partitions; slow key s of partition 0 has message 0 running (held
    on a gate) and three more waiting, so flow control is full and a's sweeps
    wait for room. Subscriber b joins: partition 1 holds nothing of a's, so it
    moves to b, and b handles four keys' 20 messages each of partition 1, in
    order, while the gate is still closed; then s's messages finish on a, in
    order."""
    await ordered(client, partitions=2, ack_deadline=1.0)
    candidates = [f"k{i}" for i in range(200)]
    slow = next(k for k in candidates if partition_for_key(k, 2) == 0)
    moving = [k for k in candidates if partition_for_key(k, 2) == 1][:4]
    journal = Journal()
    gate = asyncio.Event()

    def recorder(who: str) -> Callable[[streamsub.Message], Awaitable[None]]:
        return journal.gated(who, gate, lambda m: m.ordering_key == slow and index(m) == 0)

    flow = streamsub.FlowControl(max_messages=4)
    other = streamsub.connect(server.url)
    try:
        async with client.subscribe(
            "billing", recorder("a"), consumer="a", flow_control=flow
        ) as first:
            await until(lambda: len(first.statistics().partitions) == 2, 15, "a to own both")
            await client.publish_many("orders", keyed([slow], 0, 10))
            await until(
                lambda: (
                    first.statistics().running == 1
                    and first.statistics().flow.outstanding_messages == 4
                ),
                15,
                "s's message 0 running, flow control full",
            )
            # Sweeps start every 0.25 s; let some start and wait for room.
            await asyncio.sleep(1.0)
            async with other.subscribe(
                "billing", recorder("b"), consumer="b", flow_control=flow
            ) as second:
                await client.publish_many("orders", keyed(moving, 0, PER_KEY))
                await until(
                    lambda: second.statistics().partitions == (1,),
                    10,
                    "b to own partition 1 while s's message 0 still runs",
                )
                await until(
                    lambda: journal.distinct() == len(moving) * PER_KEY + 1,
                    10,
                    "b to handle partition 1's messages while s's message 0 still runs",
                )
                assert not gate.is_set()
                gate.set()
                await until(
                    lambda: journal.distinct() == len(moving) * PER_KEY + 10, 20, "every message"
                )
    finally:
        gate.set()
        await other.aclose()
    order = journal.first_handlings()
    assert order[slow] == list(range(10))
    assert all(order[key] == list(range(PER_KEY)) for key in moving), order
    assert journal.most_at_once_per_key == 1
    assert {key for key, _, _, who in journal.records if who == "b"} == set(moving)
