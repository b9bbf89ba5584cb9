"""Reliable delivery: backoff, exact attempts, dead letters, leases, exactly-once,
shutdown and consumers, against a real redis-server."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import time

import pytest
import redis

import streamsub
from streamsub.testing import RedisServer
from tests._layout import stream_key
from tests._wait import until
from tests.conftest import ON_CLUSTER

DEAD_LETTER_KEYS = {
    "streamsub.source_topic",
    "streamsub.source_subscription",
    "streamsub.source_message_id",
    "streamsub.delivery_attempts",
    "streamsub.dead_letter_reason",
    "streamsub.first_delivery_ms",
    "streamsub.last_delivery_ms",
}


class Inbox:
    """A handler that keeps what it is given (an async callable object)."""

    def __init__(self) -> None:
        self.messages: list[streamsub.Message] = []

    async def __call__(self, message: streamsub.Message) -> None:
        self.messages.append(message)


async def test_poison_message_is_retried_with_backoff_then_dead_lettered_once(
    client: streamsub.Client,
) -> None:
    """A message whose handler always raises is delivered exactly max_delivery_attempts
    times (attempts 1..N, gaps at least the backoff), then lands once in the
    dead-letter topic with its metadata, while other messages keep flowing."""
    await client.create_topic("orders", partitions=4)
    await client.create_topic("orders-dead")
    await client.create_subscription("orders-dead-sub", topic="orders-dead")
    await client.create_subscription(
        "billing",
        topic="orders",
        ack_deadline=1.0,
        max_delivery_attempts=4,
        dead_letter_topic="orders-dead",
        retry_policy=streamsub.RetryPolicy(minimum_backoff=0.2, maximum_backoff=1.0),
    )
    poison: list[tuple[int, float]] = []
    good: set[bytes] = set()
    dead = Inbox()

    async def handler(message: streamsub.Message) -> None:
        if message.data == b"poison":
            poison.append((message.delivery_attempt, time.monotonic()))
            raise ValueError("cannot bill this order")
        good.add(message.data)

    async with (
        client.subscribe("billing", handler),
        client.subscribe("orders-dead-sub", dead),
    ):
        poison_id = await client.publish(
            "orders", b"poison", ordering_key="c-1", attributes={"order": "7"}
        )
        for i in range(100):
            await client.publish("orders", f"good-{i}".encode())
            await asyncio.sleep(0.01)
        await until(lambda: len(dead.messages) >= 1 and len(good) == 100, 15, "the dead letter")
        await asyncio.sleep(1.5)  # time for a wrong extra delivery or dead letter

    assert [attempt for attempt, _ in poison] == [1, 2, 3, 4]
    gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(poison)]
    for gap, backoff in zip(gaps, (0.2, 0.4, 0.8), strict=True):
        assert gap >= backoff - 0.02, f"gaps {gaps} shorter than the backoff"
    assert len(dead.messages) == 1
    letter = dead.messages[0]
    assert letter.data == b"poison"
    assert letter.ordering_key == "c-1"
    assert letter.attributes["order"] == "7"
    assert set(letter.attributes) >= DEAD_LETTER_KEYS
    assert letter.attributes["streamsub.source_topic"] == "orders"
    assert letter.attributes["streamsub.source_subscription"] == "billing"
    assert letter.attributes["streamsub.source_message_id"] == poison_id
    assert letter.attributes["streamsub.delivery_attempts"] == "4"
    assert "cannot bill this order" in letter.attributes["streamsub.dead_letter_reason"]
    first = int(letter.attributes["streamsub.first_delivery_ms"])
    last = int(letter.attributes["streamsub.last_delivery_ms"])
    assert first < last
    assert (await client.subscription_stats("billing")).pending == 0


async def test_without_a_dead_letter_topic_redelivery_goes_on(client: streamsub.Client) -> None:
    """Without a dead-letter topic a failing message is redelivered past
    max_delivery_attempts, as in Pub/Sub."""
    await client.create_topic("jobs")
    await client.create_subscription(
        "workers", topic="jobs", ack_deadline=0.3, max_delivery_attempts=2
    )
    attempts: list[int] = []

    async def handler(message: streamsub.Message) -> None:
        attempts.append(message.delivery_attempt)
        if message.delivery_attempt < 4:
            raise RuntimeError("not yet")

    async with client.subscribe("workers", handler):
        await client.publish("jobs", b"job")
        await until(lambda: attempts[-1:] == [4], 10, "a fourth attempt")
    assert attempts == [1, 2, 3, 4]


async def test_nacks_count_exact_delivery_attempts(client: streamsub.Client) -> None:
    """Nacking in manual mode redelivers with delivery_attempt 1, 2, 3: the server's count."""
    await client.create_topic("counted")
    await client.create_subscription("counter", topic="counted", ack_deadline=0.5)
    attempts: list[int] = []

    async def handler(message: streamsub.Message) -> None:
        attempts.append(message.delivery_attempt)
        if message.delivery_attempt < 3:
            await message.nack()
        else:
            await message.ack()

    async with client.subscribe("counter", handler, ack_mode="manual"):
        await client.publish("counted", b"m")
        await until(lambda: len(attempts) == 3, 10, "three deliveries")
        await asyncio.sleep(0.6)
    assert attempts == [1, 2, 3]


async def test_backoff_longer_than_the_ack_deadline_is_kept(client: streamsub.Client) -> None:
    """A retry policy whose backoff exceeds the ack deadline still waits that long,
    even with another subscriber sweeping the same subscription."""
    await client.create_topic("slow-retry")
    await client.create_subscription(
        "slow-retry-sub",
        topic="slow-retry",
        ack_deadline=0.3,
        retry_policy=streamsub.RetryPolicy(minimum_backoff=1.2, maximum_backoff=5.0),
    )
    deliveries: list[float] = []

    async def handler(message: streamsub.Message) -> None:
        deliveries.append(time.monotonic())
        if message.delivery_attempt == 1:
            raise RuntimeError("again later")

    async with (
        client.subscribe("slow-retry-sub", handler, consumer="one"),
        client.subscribe("slow-retry-sub", handler, consumer="two"),
    ):
        await client.publish("slow-retry", b"m")
        await until(lambda: len(deliveries) == 2, 10, "the retry")
    assert deliveries[1] - deliveries[0] >= 1.2 - 0.02


async def test_foreign_entry_is_dead_lettered_as_undecodable(
    client: streamsub.Client, server: RedisServer, redis_client: redis.Redis
) -> None:
    """An entry written with redis-cli XADD with unknown fields lands in the
    dead-letter topic with reason "undecodable", and the subscriber keeps going."""
    await client.create_topic("mixed", partitions=2)
    await client.create_topic("mixed-dead")
    await client.create_subscription("mixed-dead-sub", topic="mixed-dead")
    await client.create_subscription("mixed-sub", topic="mixed", dead_letter_topic="mixed-dead")
    good: list[bytes] = []
    dead = Inbox()

    async def handler(message: streamsub.Message) -> None:
        good.append(message.data)

    async with (
        client.subscribe("mixed-sub", handler),
        client.subscribe("mixed-dead-sub", dead),
    ):
        cli = shutil.which("redis-cli")
        if cli and not ON_CLUSTER:  # redis-cli -u takes no cluster URL
            process = await asyncio.create_subprocess_exec(
                cli,
                "-u",
                server.url,
                "XADD",
                stream_key(redis_client, "mixed", 0),
                "*",
                "foo",
                "bar",
            )
            assert await process.wait() == 0
        else:
            redis_client.xadd(stream_key(redis_client, "mixed", 0), {"foo": "bar"})
        await client.publish("mixed", b"after")
        await until(
            lambda: bool(dead.messages and good), 10, "the dead letter and the good message"
        )
    assert good == [b"after"]
    letter = dead.messages[0]
    assert letter.attributes["streamsub.dead_letter_reason"].startswith("undecodable")
    assert json.loads(letter.data) == {"foo": "bar"}
    assert (await client.subscription_stats("mixed-sub")).pending == 0


async def test_dead_letter_called_by_the_handler(client: streamsub.Client) -> None:
    """message.dead_letter(reason) moves the message at once, with that reason;
    without a dead-letter topic it raises FailedPreconditionError."""
    await client.create_topic("manual")
    await client.create_topic("manual-dead")
    await client.create_subscription("manual-dead-sub", topic="manual-dead")
    await client.create_subscription("manual-sub", topic="manual", dead_letter_topic="manual-dead")
    await client.create_subscription("manual-plain", topic="manual")
    dead = Inbox()
    refused: list[BaseException] = []

    async def handler(message: streamsub.Message) -> None:
        await message.dead_letter("schema v1 is no longer supported")

    async def plain(message: streamsub.Message) -> None:
        try:
            await message.dead_letter("nowhere to go")
        except streamsub.FailedPreconditionError as exc:
            refused.append(exc)

    async with (
        client.subscribe("manual-sub", handler, ack_mode="manual"),
        client.subscribe("manual-plain", plain),
        client.subscribe("manual-dead-sub", dead),
    ):
        await client.publish("manual", b"old")
        await until(lambda: bool(dead.messages and refused), 10, "the dead letter and the refusal")
    assert (
        dead.messages[0].attributes["streamsub.dead_letter_reason"]
        == "schema v1 is no longer supported"
    )
    assert dead.messages[0].attributes["streamsub.delivery_attempts"] == "1"
    assert "dead_letter_topic" in str(refused[0])


async def test_a_slow_handler_keeps_its_message(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A handler taking three ack deadlines keeps its lease: the message is not
    redelivered to another subscriber of the subscription."""
    await client.create_topic("slow")
    await client.create_subscription("slow-sub", topic="slow", ack_deadline=1.0)
    seen: list[tuple[str, int]] = []

    counts: list[int] = []

    async def slow(message: streamsub.Message) -> None:
        seen.append(("slow", message.delivery_attempt))
        await asyncio.sleep(3.0)
        partition, entry_id = message.message_id.split("-", 1)
        (entry,) = redis_client.xpending_range(
            stream_key(redis_client, "slow", partition), "slow-sub", entry_id, entry_id, 1
        )
        counts.append(entry["times_delivered"])

    async def other(message: streamsub.Message) -> None:
        seen.append(("other", message.delivery_attempt))

    async with client.subscribe("slow-sub", slow, consumer="slow"):
        await client.publish("slow", b"m")
        await until(lambda: bool(seen), 5, "the first delivery")
        async with client.subscribe("slow-sub", other, consumer="other"):
            await asyncio.sleep(3.2)
    assert seen == [("slow", 1)]
    assert counts == [1], "the lease must be extended, not the message claimed again"
    assert (await client.subscription_stats("slow-sub")).pending == 0


@pytest.mark.parametrize("how", ["FlowControl", "deprecated argument"])
async def test_a_handler_past_max_lease_duration_loses_its_message(
    client: streamsub.Client, how: str
) -> None:
    """Past max_lease_duration (FlowControl's, or subscribe's deprecated argument,
    which warns) a message whose handler still runs is given up, as Pub/Sub's
    clients do: it no longer counts against flow control (max_messages=1 lets the
    next message start), it is delivered again (delivery_attempt 2) even to the
    only subscriber, and the late ack of the first handler settles nothing."""
    await client.create_topic("stuck")
    await client.create_subscription("stuck-sub", topic="stuck", ack_deadline=1.0)
    seen: list[tuple[bytes, int]] = []
    release = {1: asyncio.Event(), 2: asyncio.Event()}

    async def stuck(message: streamsub.Message) -> None:
        seen.append((message.data, message.delivery_attempt))
        if message.data == b"m":
            await release[message.delivery_attempt].wait()  # then acks (auto)

    if how == "FlowControl":
        flow = streamsub.FlowControl(max_messages=1, max_lease_duration=1.5)
        subscriber = client.subscribe("stuck-sub", stuck, consumer="stuck", flow_control=flow)
    else:
        with pytest.warns(DeprecationWarning, match="FlowControl"):
            subscriber = client.subscribe(
                "stuck-sub",
                stuck,
                consumer="stuck",
                flow_control=streamsub.FlowControl(max_messages=1),
                max_lease_duration=1.5,
            )
    async with subscriber:
        await client.publish("stuck", b"m")
        await client.publish("stuck", b"next")
        await until(lambda: (b"m", 2) in seen, 8, "the redelivery")
        assert (b"next", 1) in seen, "a given-up message still counted against flow control"
        assert subscriber.statistics().expired == 1
        release[1].set()  # the first handler returns: its ack must settle nothing
        await until(lambda: subscriber.statistics().running == 1, 5, "the first handler")
        await asyncio.sleep(0.3)  # an ack would be sent by now
        assert (await client.subscription_stats("stuck-sub")).pending == 1
        release[2].set()
        await until(lambda: subscriber.statistics().flow.outstanding_messages == 0, 5, "the acks")
    assert sorted(seen) == [(b"m", 1), (b"m", 2), (b"next", 1)]
    assert (await client.subscription_stats("stuck-sub")).pending == 0


async def test_modify_ack_deadline_zero_redelivers_at_once(client: streamsub.Client) -> None:
    """modify_ack_deadline(0) gives the message back now, well before the ack deadline."""
    await client.create_topic("again")
    await client.create_subscription("again-sub", topic="again", ack_deadline=10.0)
    deliveries: list[float] = []

    async def handler(message: streamsub.Message) -> None:
        deliveries.append(time.monotonic())
        if message.delivery_attempt == 1:
            await message.modify_ack_deadline(0)
        else:
            await message.ack()

    async with client.subscribe("again-sub", handler, ack_mode="manual"):
        await client.publish("again", b"m")
        await until(lambda: len(deliveries) == 2, 9, "the redelivery")
    # Half the 10 s ack deadline: the message was given back, not left to expire,
    # however busy the machine.
    assert deliveries[1] - deliveries[0] < 10.0 / 2


async def test_exactly_once_ack_after_a_lost_lease_raises(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """With exactly-once delivery, ack_with_response succeeds while the lease is
    held, and raises AckError(INVALID_ACK_ID) once another consumer has the message,
    which stays pending for that consumer."""
    await client.create_topic("once")
    await client.create_subscription(
        "once-sub", topic="once", ack_deadline=5.0, enable_exactly_once_delivery=True
    )
    outcomes: list[object] = []

    async def handler(message: streamsub.Message) -> None:
        if message.data == b"kept":
            await message.ack_with_response()
            outcomes.append("acked")
            return
        stream = stream_key(redis_client, "once", int(message.message_id.split("-", 1)[0]))
        entry_id = message.message_id.split("-", 1)[1]
        redis_client.xclaim(stream, "once-sub", "thief", 0, [entry_id])
        try:
            await message.ack_with_response()
        except streamsub.AckError as exc:
            outcomes.append(exc.status)
        pending = redis_client.xpending_range(stream, "once-sub", entry_id, entry_id, 1)
        outcomes.append(pending[0]["consumer"].decode())

    async with client.subscribe("once-sub", handler, ack_mode="manual"):
        await client.publish("once", b"kept")
        await until(lambda: outcomes == ["acked"], 5, "the first ack")
        await client.publish("once", b"stolen")
        await until(lambda: len(outcomes) == 3, 5, "the failed ack")
    assert outcomes == ["acked", streamsub.AckStatus.INVALID_ACK_ID, "thief"]


async def test_leaving_subscribe_releases_a_running_message_at_once(
    client: streamsub.Client,
) -> None:
    """A handler still running at shutdown_timeout is given back, so another
    subscriber gets it long before the ack deadline; acks made before are flushed."""
    await client.create_topic("handover")
    await client.create_subscription("handover-sub", topic="handover", ack_deadline=10.0)
    seen: list[tuple[str, bytes]] = []

    async def stubborn(message: streamsub.Message) -> None:
        seen.append(("first", message.data))
        if message.data == b"long":
            await asyncio.sleep(30)

    async def second(message: streamsub.Message) -> None:
        seen.append(("second", message.data))

    async with client.subscribe("handover-sub", stubborn, shutdown_timeout=0.2):
        await client.publish("handover", b"quick")
        await client.publish("handover", b"long")
        await until(lambda: len(seen) == 2, 5, "both deliveries")
    released = time.monotonic()
    async with client.subscribe("handover-sub", second):
        await until(lambda: len(seen) == 3, 9, "the handover")
    # Half the 10 s ack deadline: it was given back, not left to expire.
    assert time.monotonic() - released < 10.0 / 2
    assert seen[2] == ("second", b"long")
    assert (await client.subscription_stats("handover-sub")).pending == 0


async def test_messages_read_but_never_handled_keep_their_attempt_count(
    client: streamsub.Client,
) -> None:
    """Messages a subscriber read but never handed to its handler (on hold at
    shutdown) come back with delivery_attempt 1."""
    await client.create_topic("held", partitions=1)
    await client.create_subscription("held-sub", topic="held", ack_deadline=10.0)
    # A tiny first message makes the byte estimate low, so the next read brings
    # more 30-byte messages than may run within max_bytes: the rest wait on hold.
    await client.publish("held", b"s")
    await client.publish_many("held", [f"{i:030d}".encode() for i in range(39)])
    first: list[int] = []

    async def blocking(message: streamsub.Message) -> None:
        first.append(message.delivery_attempt)
        await asyncio.sleep(30)

    async with client.subscribe(
        "held-sub",
        blocking,
        flow_control=streamsub.FlowControl(max_messages=20, max_bytes=80),
        shutdown_timeout=0.1,
    ) as sub:
        await until(lambda: sub.statistics().flow.on_hold > 0, 5, "messages on hold")
        ran = len(first)
    attempts: dict[bytes, int] = {}

    async def handler(message: streamsub.Message) -> None:
        attempts[message.data] = message.delivery_attempt

    async with client.subscribe("held-sub", handler):
        await until(lambda: len(attempts) == 40, 10, "all forty messages")
    assert ran >= 1
    assert sorted(attempts.values()).count(2) == ran  # those that ran
    assert sorted(attempts.values()).count(1) == 40 - ran


async def test_consumer_names_and_idle_consumer_cleanup(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Default consumer names differ per subscriber; a consumer idle past
    consumer_expiry with nothing pending is deleted, one with pending entries is not."""
    await client.create_topic("crew", partitions=1)
    await client.create_subscription("crew-sub", topic="crew")

    async def nothing(message: streamsub.Message) -> None:
        """Handle nothing."""

    first, second = client.subscribe("crew-sub", nothing), client.subscribe("crew-sub", nothing)
    assert first.consumer != second.consumer
    await client.publish("crew", b"m")
    redis_client.xreadgroup(
        "crew-sub", "holder", {stream_key(redis_client, "crew", 0): ">"}, count=1
    )
    redis_client.xgroup_createconsumer(
        stream_key(redis_client, "crew", 0), "crew-sub", "idle-empty"
    )
    await asyncio.sleep(1.1)
    async with client.subscribe("crew-sub", nothing, consumer="sweeper", consumer_expiry=1.0):
        stream = stream_key(redis_client, "crew", 0)
        names = lambda: {c["name"] for c in redis_client.xinfo_consumers(stream, "crew-sub")}  # noqa: E731
        await until(
            lambda: b"idle-empty" not in names() and "idle-empty" not in names(), 5, "the cleanup"
        )
        consumers = {
            (c["name"].decode() if isinstance(c["name"], bytes) else c["name"]): c["pending"]
            for c in redis_client.xinfo_consumers(stream_key(redis_client, "crew", 0), "crew-sub")
        }
    assert "idle-empty" not in consumers
    assert consumers.get("holder") == 1


@pytest.mark.parametrize("seconds", [0, -1])
async def test_modify_ack_deadline_non_positive_means_nack(
    client: streamsub.Client, seconds: float
) -> None:
    """modify_ack_deadline with 0 or less is a nack: the message comes again."""
    await client.create_topic("mod")
    await client.create_subscription("mod-sub", topic="mod", ack_deadline=5.0)
    attempts: list[int] = []

    async def handler(message: streamsub.Message) -> None:
        attempts.append(message.delivery_attempt)
        if message.delivery_attempt == 1:
            await message.modify_ack_deadline(seconds)
        else:
            await message.ack()

    async with client.subscribe("mod-sub", handler, ack_mode="manual"):
        await client.publish("mod", b"m")
        await until(lambda: attempts == [1, 2], 5, "the redelivery")


async def test_pending_entries_trimmed_away_are_counted_lost(
    client: streamsub.Client, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry deleted from the stream while pending (trimmed by someone else) is
    counted as lost and logged when the reclaimer finds it, never dropped silently."""
    await client.create_topic("trimmed", partitions=1)
    await client.create_subscription("trimmed-sub", topic="trimmed", ack_deadline=0.5)
    redis_client.xreadgroup("trimmed-sub", "crashed", {stream_key(redis_client, "trimmed", 0): ">"})
    await client.publish("trimmed", b"doomed")
    (entry,) = redis_client.xreadgroup(
        "trimmed-sub", "crashed", {stream_key(redis_client, "trimmed", 0): ">"}
    )[0][1]
    redis_client.xdel(stream_key(redis_client, "trimmed", 0), entry[0])

    async def handler(message: streamsub.Message) -> None:
        raise AssertionError("a deleted entry must not be delivered")

    async with client.subscribe("trimmed-sub", handler) as sub:
        await until(lambda: sub.statistics().lost == 1, 5, "the loss to be counted")
    assert any("lost" in record.getMessage() for record in caplog.records)
    assert (await client.subscription_stats("trimmed-sub")).pending == 0
