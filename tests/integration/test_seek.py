"""Seek and snapshots on a real Redis, over several partitions."""

from __future__ import annotations

import asyncio
import collections
import datetime
import time
from collections.abc import AsyncIterator

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._layout import backend_class, stream_key
from tests._wait import until

PARTITIONS = 4


@pytest.fixture
async def client(server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[streamsub.Client]:
    """A client on an emptied server that trims only when a test asks it to."""
    redis_client.flushall()
    async with streamsub.connect(server.url, trim_in_background=False) as connected:
        yield connected


def _keys_per_partition(count: int) -> dict[int, list[str]]:
    keys: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    i = 0
    while min(len(k) for k in keys.values()) < count:
        key = f"key-{i}"
        keys[streamsub.fnv1a_32(key.encode()) % PARTITIONS].append(key)
        i += 1
    return keys


KEYS = _keys_per_partition(20)


async def _publish(client: streamsub.Client, per_partition: int, tag: str) -> list[str]:
    """Publish ``per_partition`` messages to every partition; return their ids."""
    return await client.publish_many(
        "orders",
        [
            streamsub.OutgoingMessage(data=f"{tag}-{i}".encode(), ordering_key=KEYS[p][i % 20])
            for i in range(per_partition)
            for p in range(PARTITIONS)
        ],
    )


async def _receive(client: streamsub.Client, expected: int) -> set[str]:
    """Run a subscriber until ``expected`` messages were handled; return their ids."""
    seen: list[str] = []

    async def handle(message: streamsub.Message) -> None:
        seen.append(message.message_id)

    async with client.subscribe("billing", handle):
        await until(lambda: len(seen) >= expected, 30, f"{expected} messages")
    assert len(seen) == len(set(seen)), "no message was handled twice"
    return set(seen)


def _after_clock_moves() -> datetime.datetime:
    """A moment strictly after every id published so far, and before any published next."""
    start = time.time()
    while time.time() * 1000 < int(start * 1000) + 2:
        pass
    return datetime.datetime.fromtimestamp(int(start * 1000 + 1) / 1000, tz=datetime.UTC)


async def _setup(client: streamsub.Client) -> None:
    await client.create_topic("orders", partitions=PARTITIONS)
    await client.create_subscription("billing", topic="orders", ack_deadline=1)


async def test_seek_to_a_time_replays_exactly_the_retained_messages_after_it(
    client: streamsub.Client,
) -> None:
    """Seeking to a time redelivers, on every partition, exactly the messages published
    at or after it that retention kept, and none before it."""
    await _setup(client)
    before = await _publish(client, 50, "before")
    point = _after_clock_moves()
    after = await _publish(client, 75, "after")
    assert await _receive(client, len(before) + len(after)) == set(before) | set(after)
    await client.update_topic_retention("orders", streamsub.Retention(max_length=50))
    await client.enforce_retention("orders")
    retained_after = set(after[-50 * PARTITIONS :])
    assert {int(i.split("-")[0]) for i in retained_after} == set(range(PARTITIONS))

    result = await client.seek("billing", to=point)

    assert result.acknowledged == 0
    assert await _receive(client, len(retained_after)) == retained_after


async def test_seek_settles_pending_messages_by_the_point(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Pending messages before the point count as acknowledged; those after it stay
    unacknowledged and are delivered again."""
    await _setup(client)
    before = await _publish(client, 30, "before")
    point = _after_clock_moves()
    after = await _publish(client, 30, "after")
    for p in range(PARTITIONS):  # everything delivered to a consumer that vanished
        redis_client.xreadgroup("billing", "gone", {stream_key(redis_client, "orders", p): ">"})

    result = await client.seek("billing", to=point)

    assert result.acknowledged == len(before)
    pending = {
        f"{p}-{row['message_id'].decode()}"
        for p in range(PARTITIONS)
        for row in redis_client.xpending_range(
            stream_key(redis_client, "orders", p), "billing", "-", "+", 1000
        )
    }
    assert pending == set(after)
    assert await _receive(client, len(after)) == set(after)


async def test_seek_earliest_and_latest(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """'earliest' redelivers every retained message; 'latest' acknowledges every pending
    one and delivers only what is published afterwards."""
    await _setup(client)
    first = await _publish(client, 25, "first")
    assert await _receive(client, len(first)) == set(first)

    await client.seek("billing", to="earliest")
    assert await _receive(client, len(first)) == set(first)

    for p in range(PARTITIONS):
        redis_client.xgroup_setid(stream_key(redis_client, "orders", p), "billing", "0")
        redis_client.xreadgroup("billing", "gone", {stream_key(redis_client, "orders", p): ">"})
    result = await client.seek("billing", to="latest")
    assert result.acknowledged == len(first)
    (report,) = (await client.stats("orders")).subscriptions
    assert (report.pending, report.backlog) == (0, 0)
    later = await _publish(client, 10, "later")
    assert await _receive(client, len(later)) == set(later)


async def test_seek_to_a_message_id(client: streamsub.Client) -> None:
    """Seeking to a message id redelivers that message and everything published after
    its time, on its partition from exactly that message."""
    await _setup(client)
    ids = await _publish(client, 40, "m")
    assert await _receive(client, len(ids)) == set(ids)
    target = ids[len(ids) // 2]
    partition, entry_id = target.split("-", 1)
    ms, seq = (int(x) for x in entry_id.split("-"))

    def replayed(message_id: str) -> bool:
        p, rest = message_id.split("-", 1)
        m, s = (int(x) for x in rest.split("-"))
        return (m, s) >= (ms, seq) if p == partition else m >= ms

    expected = {i for i in ids if replayed(i)}
    assert target in expected
    await client.seek("billing", to=target)
    assert await _receive(client, len(expected)) == expected


async def test_seek_to_a_snapshot_redelivers_what_was_unacknowledged_then(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A snapshot seek redelivers the messages pending when the snapshot was taken and
    every message published after it, and nothing acknowledged before it."""
    await _setup(client)
    acked = await _publish(client, 30, "acked")
    assert await _receive(client, len(acked)) == set(acked)
    pending_then = await _publish(client, 10, "pending")
    for p in range(PARTITIONS):
        redis_client.xreadgroup("billing", "gone", {stream_key(redis_client, "orders", p): ">"})
    unread_then = await _publish(client, 5, "unread")

    snapshot = await client.create_snapshot("before-deploy", "billing")
    assert (snapshot.name, snapshot.subscription, snapshot.topic) == (
        "before-deploy",
        "billing",
        "orders",
    )
    # Everything gets handled and acknowledged, and more is published.
    later = await _publish(client, 10, "later")
    assert await _receive(client, 55 * PARTITIONS - 30 * PARTITIONS) == (
        set(pending_then) | set(unread_then) | set(later)
    )
    assert (await client.subscription_stats("billing")).pending == 0

    result = await client.seek("billing", to="before-deploy")

    assert result.redelivered_pending == len(pending_then)
    assert await _receive(client, len(pending_then) + len(unread_then) + len(later)) == (
        set(pending_then) | set(unread_then) | set(later)
    )


async def test_snapshots_are_listed_and_deleted(client: streamsub.Client) -> None:
    """Snapshots show in list_snapshots until deleted; names are unique and checked."""
    await _setup(client)
    await client.create_snapshot("snap-a", "billing")
    await client.create_snapshot("snap-b", "billing")
    assert [s.name for s in await client.list_snapshots()] == ["snap-a", "snap-b"]
    with pytest.raises(streamsub.AlreadyExistsError):
        await client.create_snapshot("snap-a", "billing")
    with pytest.raises(streamsub.InvalidArgumentError):
        await client.create_snapshot("latest", "billing")
    await client.delete_snapshot("snap-a")
    assert [s.name for s in await client.list_snapshots()] == ["snap-b"]
    with pytest.raises(streamsub.NotFoundError):
        await client.delete_snapshot("snap-a")
    with pytest.raises(streamsub.NotFoundError):
        await client.seek("billing", to="snap-a")


async def test_seek_refuses_bad_targets(client: streamsub.Client) -> None:
    """A naive datetime, a malformed id or a partition out of range raises before anything moves."""
    await _setup(client)
    with pytest.raises(streamsub.InvalidArgumentError, match="time zone"):
        await client.seek("billing", to=datetime.datetime(2024, 1, 1))
    with pytest.raises(streamsub.InvalidArgumentError):
        await client.seek("billing", to="12-abc")
    with pytest.raises(streamsub.InvalidArgumentError, match="partition 9"):
        await client.seek("billing", to="9-1-0")


async def test_a_live_snapshot_holds_back_retention_and_an_expired_one_does_not(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """Retention keeps what a live snapshot would redeliver, so the seek finds it all;
    an expired snapshot holds nothing back, is deleted, and cannot be sought to."""
    await _setup(client)
    acked = await _publish(client, 20, "acked")
    assert await _receive(client, len(acked)) == set(acked)
    pending_then = await _publish(client, 10, "pending")
    for p in range(PARTITIONS):
        redis_client.xreadgroup("billing", "gone", {stream_key(redis_client, "orders", p): ">"})
    await client.create_snapshot("keep", "billing")
    later = await _publish(client, 10, "later")
    assert await _receive(client, len(pending_then) + len(later)) == set(pending_then) | set(later)
    await client.update_topic_retention("orders", streamsub.Retention(max_length=5))

    result = await client.enforce_retention("orders")

    # Only the 20 acknowledged before the snapshot went, on every partition.
    assert [t.trimmed for t in result.partitions] == [20] * PARTITIONS
    await client.seek("billing", to="keep")
    assert await _receive(client, len(pending_then) + len(later)) == set(pending_then) | set(later)

    await client.create_snapshot("old", "billing")
    # Seven days later by the server's clock: the record and its holds expired.
    past = time.time() - 86_400
    redis_client.hset("ss:snapshot:old", "expires", repr(past))
    for p in range(PARTITIONS):
        holds = f"{stream_key(redis_client, 'orders', p)}:holds"
        needs = redis_client.hget(holds, "old").split()[0].decode()  # type: ignore[union-attr]
        redis_client.hset(holds, "old", f"{needs} {int(past * 1000)}")
    await client.delete_snapshot("keep")
    assert [s.name for s in await client.list_snapshots()] == []
    assert redis_client.exists("ss:snapshot:old") == 0
    with pytest.raises(streamsub.NotFoundError):
        await client.seek("billing", to="old")
    result = await client.enforce_retention("orders")
    assert [t.trimmed for t in result.partitions] == [15] * PARTITIONS


async def test_a_seek_while_messages_are_held_frees_their_flow_control_budget(
    client: streamsub.Client,
) -> None:
    """Seeking back while a subscriber holds 10 messages delivers them again; once
    every delivery is settled nothing stays counted in flow control, and new
    messages still flow."""
    await client.create_topic("heldseek", partitions=2)
    await client.create_subscription("heldseek-sub", topic="heldseek")
    await client.publish_many("heldseek", [str(i).encode() for i in range(10)])
    release = asyncio.Event()
    seen: list[int] = []

    async def handler(message: streamsub.Message) -> None:
        seen.append(message.delivery_attempt)
        await release.wait()

    async with client.subscribe("heldseek-sub", handler) as sub:
        await until(lambda: len(seen) == 10, 5, "10 held")
        await client.seek("heldseek-sub", to="earliest")
        await until(lambda: len(seen) == 20, 5, "the 10 delivered again")
        release.set()
        await until(lambda: sub.statistics().flow.outstanding_messages == 0, 5, "nothing held")
        await client.publish_many("heldseek", [b"later"] * 5)
        await until(lambda: len(seen) == 25, 5, "new messages after the seek")
    flow = sub.statistics().flow
    assert flow.running_messages == 0
    assert flow.outstanding_bytes == 0


async def test_a_seek_settles_many_pending_in_bounded_steps_and_spares_later_deliveries(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """A seek to "latest" over 3,000 pending per partition acknowledges them in
    steps of at most SEEK_STEP entries; messages delivered between two steps
    (after the position was set) stay pending."""
    from streamsub._engine.seek import seek

    await client.create_topic("orders", partitions=PARTITIONS)
    await client.create_subscription("billing", topic="orders", start="earliest")
    await _publish(client, 3000, "old")
    for p in range(PARTITIONS):
        redis_client.xreadgroup(
            "billing", "c", {stream_key(redis_client, "orders", p): ">"}, count=10_000
        )
    backend = backend_class(server.url)(server.url)
    backend.SEEK_STEP = 1000  # type: ignore[misc]
    real = backend._evalsha
    steps: list[str] = []
    late: dict[int, list[bytes]] = {}

    async def observed(script, keys, args):  # type: ignore[no-untyped-def]
        reply = await real(script, keys, args)
        if script is backend._seek:
            steps.append(args[1])
            if args[1] == "set":  # a subscriber reads new messages between two steps
                tag = keys[0][keys[0].index("{") + 1 : keys[0].index("}")]
                partition = int(tag.rpartition(".")[2].partition("|")[0])  # <topic>.<n>[|salt]
                entry = redis_client.xadd(
                    stream_key(redis_client, "orders", partition), {"d": "late"}
                )
                redis_client.xreadgroup(
                    "billing", "c", {stream_key(redis_client, "orders", partition): ">"}
                )
                late[partition] = [entry]
        return reply

    backend._evalsha = observed  # type: ignore[method-assign]
    try:
        topic = await backend.get_topic("orders")
        assert topic is not None
        result = await seek(backend, topic, "billing", "latest")
    finally:
        await backend.close()
    assert result.acknowledged == PARTITIONS * 3000
    assert steps.count("ack") >= PARTITIONS * 3
    for p in range(PARTITIONS):
        pending = redis_client.xpending_range(
            stream_key(redis_client, "orders", p), "billing", "-", "+", 100
        )
        assert [e["message_id"] for e in pending] == late[p]


async def test_a_seek_back_over_parked_nacks_delivers_each_once_to_two_subscribers(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Messages nacked with a backoff longer than the ack deadline (parked in the
    delay set), then a seek back: two subscribers handle each exactly once, and
    the old delay coming due meanwhile takes none from under its handler."""
    await client.create_topic("orders", partitions=PARTITIONS)
    await client.create_subscription(
        "billing",
        topic="orders",
        ack_deadline=1,
        retry_policy=streamsub.RetryPolicy(minimum_backoff=2, maximum_backoff=2),
    )
    ids = await _publish(client, 10, "m")
    nacked: set[str] = set()

    async def nack(message: streamsub.Message) -> None:
        nacked.add(message.message_id)
        message.nack()

    async with client.subscribe("billing", nack, ack_mode="manual"):
        await until(lambda: len(nacked) == len(ids), 20, "every message nacked")
    parked = sum(
        c["pending"]
        for p in range(PARTITIONS)
        for c in redis_client.xinfo_consumers(stream_key(redis_client, "orders", p), "billing")
        if c["name"] == b"streamsub.delayed"
    )
    assert parked == len(ids)
    await client.seek("billing", to="earliest")
    handled: collections.Counter[str] = collections.Counter()

    async def slow(message: streamsub.Message) -> None:
        handled[message.message_id] += 1
        await asyncio.sleep(3)  # past the moment the old 2-s backoff comes due

    async with (
        client.subscribe("billing", slow, consumer="a"),
        client.subscribe("billing", slow, consumer="b"),
    ):
        await until(
            lambda: len(handled) == len(ids) and _pending(redis_client) == 0,
            30,
            "every message handled and acknowledged",
        )
    assert set(handled) == set(ids)
    assert [i for i, n in handled.items() if n > 1] == []


def _pending(redis_client: redis.Redis) -> int:
    """Pending entries of billing over every partition."""
    return sum(
        int(redis_client.xpending(stream_key(redis_client, "orders", p), "billing")["pending"])
        for p in range(PARTITIONS)
    )
