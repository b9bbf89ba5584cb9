"""Leaving ``subscribe()``: leases held while handlers finish, nothing read is
counted as delivered unless a handler saw it, and a subscription that is gone
ends the subscriber with an error the caller sees."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import streamsub
from streamsub import Message
from tests._wait import until


async def test_leases_are_extended_while_handlers_finish_at_shutdown(
    client: streamsub.Client,
) -> None:
    """20 slow handlers (3 s, ack deadline 1 s) still run when their subscriber is
    stopped: their leases stay held, so a second subscriber takes none of them,
    and all 20 are acked as attempt 1."""
    await client.create_topic("deploy", partitions=2)
    await client.create_subscription("deploy-sub", topic="deploy", ack_deadline=1.0)
    await client.publish_many(
        "deploy",
        [streamsub.OutgoingMessage(data=f"m{i}".encode(), ordering_key=f"k{i}") for i in range(20)],
    )
    first: list[Message] = []
    second: list[Message] = []
    finished: list[float] = []

    async def slow(message: Message) -> None:
        first.append(message)
        await asyncio.sleep(3.0)
        finished.append(time.monotonic())

    async def other(message: Message) -> None:
        second.append(message)

    old = client.subscribe("deploy-sub", slow, consumer="leaves", shutdown_timeout=10.0)
    await old.start()
    await until(lambda: len(first) == 20, 5, "the leaving subscriber to hold all 20")
    async with client.subscribe("deploy-sub", other, consumer="stays"):
        started = time.monotonic()
        await old.stop()
        stopped = time.monotonic()
        # It waited for every handler (however long the machine took to get here
        # from their start), and not for the 10 s shutdown timeout.
        assert len(finished) == 20, "stop() did not wait for every handler"
        assert max(finished) <= stopped, "stop() did not wait for every handler"
        assert stopped - started < 10.0
        await asyncio.sleep(1.5)
    assert second == []
    assert old.statistics().acked == 20
    assert [m.delivery_attempt for m in first] == [1] * 20


async def test_entries_read_while_stopping_come_back_without_a_delivery_counted(
    client: streamsub.Client,
) -> None:
    """Entries a blocked read brings back as the subscriber stops are given back
    uncounted: the next subscriber receives each of the 50 as attempt 1 (or the
    first one handled and acked it)."""
    await client.create_topic("midread", partitions=4)
    await client.create_subscription("midread-sub", topic="midread", ack_deadline=1.0)
    handled_by_first: set[str] = set()

    async def first(message: Message) -> None:
        handled_by_first.add(message.message_id)

    ids: list[str] = []

    def publish_from_another_thread() -> None:
        async def publish() -> None:
            async with streamsub.connect(client.url) as other:
                ids.extend(await other.publish_many("midread", [b"x"] * 50))

        asyncio.run(publish())

    subscriber = client.subscribe("midread-sub", first)
    await subscriber.start()
    await asyncio.sleep(0.5)  # both reads are blocked at the server now
    publisher = threading.Thread(target=publish_from_another_thread)
    publisher.start()
    publisher.join()
    # The loop has not run since: the reads' replies wait in their sockets.
    await subscriber.stop()
    seen: dict[str, int] = {}

    async def second(message: Message) -> None:
        seen[message.message_id] = message.delivery_attempt

    async with client.subscribe("midread-sub", second):
        await until(
            lambda: set(seen) | handled_by_first == set(ids), 5, "every message handled once"
        )
        await asyncio.sleep(1.5)
    assert len(ids) == 50
    assert not set(seen) & handled_by_first
    assert set(seen.values()) <= {1}, seen


async def test_a_deleted_subscription_ends_the_subscriber_with_an_error(
    client: streamsub.Client,
) -> None:
    """Deleting the subscription under a running subscriber stops it: wait()
    raises SubscriptionNotFoundError, and so does leaving its block."""
    await client.create_topic("gone", partitions=3)
    await client.create_subscription("gone-sub", topic="gone")
    await client.publish_many("gone", [b"a"] * 30)
    handled: list[Message] = []

    async def handler(message: Message) -> None:
        handled.append(message)

    sub = client.subscribe("gone-sub", handler)
    await sub.__aenter__()
    await until(lambda: len(handled) == 30, 5, "the first messages")
    await client.delete_subscription("gone-sub")
    with pytest.raises(streamsub.SubscriptionNotFoundError):
        await asyncio.wait_for(sub.wait(), 10)
    with pytest.raises(streamsub.SubscriptionNotFoundError):
        await sub.__aexit__(None, None, None)
    assert isinstance(sub.error, streamsub.SubscriptionNotFoundError)


async def test_a_deleted_topic_ends_the_subscriber_with_an_error(
    client: streamsub.Client,
) -> None:
    """Deleting the topic (force) under a running subscriber ends it with
    SubscriptionNotFoundError instead of warnings for ever."""
    await client.create_topic("vanish", partitions=2)
    await client.create_subscription("vanish-sub", topic="vanish")

    async def handler(message: Message) -> None:
        """Nothing arrives."""

    sub = client.subscribe("vanish-sub", handler)
    await sub.start()
    await client.delete_topic("vanish", force=True)
    with pytest.raises(streamsub.SubscriptionNotFoundError):
        await asyncio.wait_for(sub.wait(), 10)
    await sub.stop()


async def test_wait_returns_after_a_plain_stop(client: streamsub.Client) -> None:
    """wait() returns (no error) once the subscriber was stopped by its owner."""
    await client.create_topic("plain", partitions=2)
    await client.create_subscription("plain-sub", topic="plain")

    async def handler(message: Message) -> None:
        """Nothing arrives."""

    sub = client.subscribe("plain-sub", handler)
    await sub.start()
    waiter = asyncio.create_task(sub.wait())
    await sub.stop()
    await asyncio.wait_for(waiter, 5)
    assert sub.error is None
