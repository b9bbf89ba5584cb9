"""A nack parked in the delay set while its key's later messages fill the budget."""

from __future__ import annotations

import asyncio

import pytest

import streamsub
from tests._wait import until
from tests.ordered_faults._keys import index, keyed, ordered


@pytest.mark.timeout(60)
@pytest.mark.parametrize("partitions", [1, 8])
async def test_a_parked_nack_comes_back_when_its_keys_later_messages_fill_the_budget(
    client: streamsub.Client, partitions: int
) -> None:
    """max_messages=10, one hot key of 40 and a backoff (2 s) longer than the ack
    deadline (1 s), so the nack waits parked in the delay set: it still comes back
    and the key goes on in order."""
    await ordered(client, partitions=partitions, ack_deadline=1.0, backoff=2.0)
    seen: list[tuple[int, int]] = []

    async def handler(message: streamsub.Message) -> None:
        seen.append((index(message), message.delivery_attempt))
        if index(message) == 0 and message.delivery_attempt == 1:
            await asyncio.sleep(0.5)
            raise RuntimeError("not yet")

    flow = streamsub.FlowControl(max_messages=10)
    async with client.subscribe("billing", handler, flow_control=flow):
        await client.publish_many("orders", keyed(["hot"], 0, 40))
        await until(lambda: len(seen) == 41, 30, "every message of the hot key")
    assert seen == [(0, 1), (0, 2)] + [(n, 1) for n in range(1, 40)]
