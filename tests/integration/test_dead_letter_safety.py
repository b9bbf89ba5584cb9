"""Dead-lettering with many entries: each written once, and within flow control."""

from __future__ import annotations

import redis

import streamsub
from streamsub._core.codec import encode
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
    assert redis_client.xlen("ss:{dl-dst.0}") == 20
    assert redis_client.xpending("ss:{dl-src.0}", "dl-sub")["pending"] == 0


async def test_exhausted_entries_take_flow_control_budget_until_dead_lettered(
    client: streamsub.Client, redis_client: redis.Redis
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
            "spent-sub", "crashed", {f"ss:{{spent.{partition}}}": ">"}, count=100
        )
    seen_outstanding: list[int] = []

    async def never(message: streamsub.Message) -> None:
        raise AssertionError("an exhausted message reached the handler")

    flow = streamsub.FlowControl(max_messages=5)
    async with client.subscribe("spent-sub", never, flow_control=flow) as sub:

        def done() -> bool:
            seen_outstanding.append(sub.statistics().flow.outstanding_messages)
            return redis_client.xlen("ss:{spent-dl.0}") == 60

        await until(done, 20, "60 dead letters")
        assert sub.statistics().dead_lettered == 60
    assert max(seen_outstanding) <= 5
    assert max(seen_outstanding) >= 1, "exhausted entries were not counted in flow control"
    assert redis_client.xpending("ss:{spent.0}", "spent-sub")["pending"] == 0
