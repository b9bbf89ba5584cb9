"""Flow control on an ordered subscription: what is held back for order counts."""

from __future__ import annotations

import asyncio
import random

import pytest

import streamsub
from tests._wait import until
from tests.ordered_faults._keys import ordered


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hot", [False, True])
async def test_ordered_backlog_never_holds_or_runs_more_than_max_messages(
    client: streamsub.Client, hot: bool
) -> None:
    """A backlog of 10,000 messages over 200 keys (or one hot key with half of
    them), 8 partitions, ordered, max_messages=50 and max_bytes for 40 of them:
    sampled at every handler start, never more than 50 held, never more than 50
    running, held bytes never past max_bytes (sizes are even), and reading
    pauses at full load."""
    await ordered(client, partitions=8)
    keys = [f"key-{k:03}" for k in range(200)]  # every message of one size
    messages = [
        streamsub.OutgoingMessage(
            data=f"{key}:{n}".ljust(16).encode(), ordering_key="key-hot" if hot and k % 2 else key
        )
        for n in range(50)
        for k, key in enumerate(keys)
    ]
    for start in range(0, len(messages), 1000):
        await client.publish_many("orders", messages[start : start + 1000])
    size = 16 + 7
    flow = streamsub.FlowControl(max_messages=50, max_bytes=size * 40 + 20)
    samples: list[tuple[int, int, int]] = []
    rng = random.Random(5)
    subscriber: streamsub.Subscriber | None = None

    async def handler(message: streamsub.Message) -> None:
        assert subscriber is not None
        stats = subscriber.statistics()
        samples.append(
            (stats.flow.outstanding_messages, stats.running, stats.flow.outstanding_bytes)
        )
        await asyncio.sleep(rng.random() * 0.004)

    async with client.subscribe("billing", handler, flow_control=flow) as sub:
        subscriber = sub
        await until(lambda: sub.statistics().acked == len(messages), 100, "every message acked")
    assert max(held for held, _, _ in samples) <= 50
    assert max(running for _, running, _ in samples) <= 50
    most_bytes = max(b for _, _, b in samples)
    assert most_bytes <= flow.max_bytes, (most_bytes, flow.max_bytes)
