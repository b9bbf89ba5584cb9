"""Seeks on an ordered subscription redeliver each key in stream order.

A snapshot seek makes the entries pending then pending again (under a parked
consumer, idle for a day) and moves the group back; the partitions' owners
keep reading after the position. Unless they take the restored entries over
first, the newer entries of a key overtake them. A seek back (to a time or
``earliest``) leaves the entries pending above the new position with their
consumers; a sweep that takes them lets them overtake the older entries the
read has not reached yet."""

from __future__ import annotations

import redis

import streamsub
from tests._layout import stream_key, stream_keys
from tests._wait import until
from tests.ordered_faults._keys import Journal, keyed, ordered
from tests.ordered_faults._order import regressions

PARTITIONS = 4
KEYS = [f"k{i}" for i in range(24)]
ACK_DEADLINE = 60.0
"""Long: the periodic sweep (every quarter ack deadline) comes 15 s after a
subscriber starts, so only a take-over can deliver restored entries sooner."""


def _handlings(journal: Journal) -> dict[str, list[int]]:
    per_key: dict[str, list[int]] = {}
    with journal.lock:
        for key, n, _, _ in journal.records:
            per_key.setdefault(key, []).append(n)
    return per_key


async def test_a_snapshot_seek_under_two_running_owners_redelivers_each_key_in_order(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Four partitions, 24 keys: messages 0-4 acked, 5-6 pending under a consumer
    that vanished, 7-8 unread when the snapshot is taken, 9-10 published after.
    Two ordered subscribers take the partitions and handle everything; then a
    seek to the snapshot while they run: every key's 5-10 is handled again,
    once each, in stream order (none of 7-10 before 5 and 6)."""
    await ordered(client, partitions=PARTITIONS, ack_deadline=ACK_DEADLINE, start="earliest")
    journal = Journal()

    async def handle(message: streamsub.Message) -> None:
        journal.enter(message)
        journal.leave(message)

    await client.publish_many("orders", keyed(KEYS, 0, 5))
    async with client.subscribe("billing", handle, consumer="a") as first:
        await until(lambda: first.statistics().acked == 5 * len(KEYS), 30, "0-4 acked")
    await client.publish_many("orders", keyed(KEYS, 5, 7))
    for p in range(PARTITIONS):  # delivered to a consumer that vanished: pending
        redis_client.xreadgroup("billing", "gone", {stream_key(redis_client, "orders", p): ">"})
    await client.publish_many("orders", keyed(KEYS, 7, 9))
    await client.create_snapshot("snap", "billing")
    await client.publish_many("orders", keyed(KEYS, 9, 11))
    again = 6 * len(KEYS)
    async with (
        client.subscribe("billing", handle, consumer="a") as one,
        client.subscribe("billing", handle, consumer="b") as two,
    ):
        await until(
            lambda: one.statistics().acked + two.statistics().acked == again, 30, "5-10 acked"
        )
        base = one.statistics().acked + two.statistics().acked
        with journal.lock:
            journal.records.clear()
        result = await client.seek("billing", to="snap")
        assert result.redelivered_pending == 2 * len(KEYS)
        await until(
            lambda: one.statistics().acked + two.statistics().acked - base >= again,
            40,
            "5-10 acked again",
        )
        assert (await client.subscription_stats("billing")).pending == 0
    assert regressions(journal) == {}
    wrong = {k: seq for k, seq in _handlings(journal).items() if seq != list(range(5, 11))}
    assert wrong == {}
    assert set(_handlings(journal)) == set(KEYS)


async def test_a_seek_to_earliest_redelivers_each_key_in_order_past_a_vanished_consumers_entries(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Four partitions, 24 keys, messages 0-4 delivered to a consumer that vanished
    after acking 0-2 (3-4 stay pending with it). A seek to ``earliest``; then two
    ordered subscribers take the partitions over: every key's 0-4 is handled
    once each, in stream order (3-4 are not swept ahead of 0-2: a read
    delivers them again after those)."""
    await ordered(client, partitions=PARTITIONS, ack_deadline=ACK_DEADLINE, start="earliest")
    journal = Journal()

    async def handle(message: streamsub.Message) -> None:
        journal.enter(message)
        journal.leave(message)

    await client.publish_many("orders", keyed(KEYS, 0, 5))
    for p in range(PARTITIONS):
        stream = stream_key(redis_client, "orders", p)
        reply = redis_client.xreadgroup("billing", "gone", {stream: ">"})
        entries = reply[0][1]
        acked = [entry_id for entry_id, fields in entries if int(fields[b"d"].split(b":")[1]) < 3]
        assert acked
        assert len(acked) < len(entries)
        redis_client.xack(stream, "billing", *acked)
    result = await client.seek("billing", to="earliest")
    assert result.acknowledged == 0
    async with (
        client.subscribe("billing", handle, consumer="a") as one,
        client.subscribe("billing", handle, consumer="b") as two,
    ):
        await until(
            lambda: one.statistics().acked + two.statistics().acked >= 5 * len(KEYS),
            30,
            "0-4 acked",
        )
        await until(
            lambda: all(
                redis_client.xpending(stream, "billing")["pending"] == 0
                for stream in stream_keys(redis_client, "orders", PARTITIONS)
            ),
            10,
            "nothing pending",
        )
    assert regressions(journal) == {}
    wrong = {k: seq for k, seq in _handlings(journal).items() if seq != list(range(5))}
    assert wrong == {}
    assert set(_handlings(journal)) == set(KEYS)
