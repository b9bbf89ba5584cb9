"""Conformance checks: the behaviour every backend must show, as library code.

In the spirit of ``trio.testing.check_one_way_stream``: each check is an
``async def check_xxx(client)`` that drives a connected
:class:`~streamsub.Client` through the public API only, so it runs unchanged
against any backend (Redis standalone, Redis Cluster, later others), and raises
:class:`AssertionError` saying what went wrong. :data:`CONFORMANCE_CHECKS`
lists them all, for a test suite to parametrize over::

    @pytest.mark.parametrize("check", CONFORMANCE_CHECKS)
    async def test_conformance(client, check):
        await check(client)

Every check makes its own topics and subscriptions under fresh names and
deletes them afterwards, so checks can share a server with each other and with
other data.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from ._client import Client
from ._core.partition import fnv1a_32
from ._errors import StreamsubError
from ._message import Message, OutgoingMessage
from ._settings import FlowControl
from .tracing import TRACEPARENT

_TRACE_CONTEXT = frozenset({TRACEPARENT, "tracestate"})
"""Attributes streamsub adds to a publish made under a tracing SDK."""

__all__ = [
    "CONFORMANCE_CHECKS",
    "check_auto_ack_exception_nacks",
    "check_end_to_end_ordering_keys",
    "check_flow_control_bounds_concurrency",
    "check_manual_ack_and_nack",
    "check_publish_returns_ids",
    "check_start_latest_vs_earliest",
    "check_stop_flushes_acks",
    "check_sync_handler",
]

Check = Callable[[Client], Awaitable[None]]

_ID = re.compile(r"(\d+)-(\d+)-(\d+)")
"""A message id: partition, then the stream entry id (milliseconds, sequence)."""
_ARRIVAL_TIMEOUT = 10.0
"""How long a check waits for messages that should arrive within a second."""
_BULK_ARRIVAL_TIMEOUT = 90.0
"""How long the 10,000-message check waits for all of them."""
_SHORT_DEADLINE = 1.0
"""The ack deadline of checks that wait for a redelivery: short, so they are fast."""
_QUIET = 0.3
"""How long a check watches for a message that must not arrive (no redelivery involved)."""
_CLOCK_SKEW = 60.0
"""How far a server's publish time may be from this machine's clock."""


def _name(label: str) -> str:
    # Valid for every backend: starts with a letter, 3-255 of [A-Za-z0-9-_.~+%].
    return f"conformance-{label}-{uuid.uuid4().hex[:10]}"


@contextlib.asynccontextmanager
async def _topic(client: Client, label: str, *, partitions: int = 16) -> AsyncIterator[str]:
    """A fresh topic, deleted (with its subscriptions) when the block ends."""
    name = _name(label)
    await client.create_topic(name, partitions=partitions)
    try:
        yield name
    finally:
        with contextlib.suppress(StreamsubError):  # do not hide the check's own failure
            await client.delete_topic(name, force=True)


async def _wait_until(
    condition: Callable[[], bool], what: Callable[[], str], timeout: float = _ARRIVAL_TIMEOUT
) -> None:
    """Return once ``condition()`` holds; raise AssertionError(what()) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout:.0f} s: {what()}")
        await asyncio.sleep(0.01)


def _partition_of(message_id: str) -> int:
    match = _ID.fullmatch(message_id)
    if match is None:
        raise AssertionError(
            f"message id {message_id!r} is not '<partition>-<milliseconds>-<sequence>'"
        )
    return int(match.group(1))


async def check_end_to_end_ordering_keys(client: Client) -> None:
    """10,000 messages with 100 ordering keys on 16 partitions reach two subscribers of
    one subscription intact: every one arrives with the id, data and attributes it was
    published with, in the partition ``fnv1a_32(key) % 16``, and both subscribers
    get a share."""
    count, keys, partitions, chunk = 10_000, 100, 16, 500
    async with _topic(client, "e2e", partitions=partitions) as topic:
        subscription = _name("e2e")
        await client.create_subscription(subscription, topic=topic, start="latest")
        received: dict[str, dict[str, Message]] = {"first": {}, "second": {}}

        def handler_for(consumer: str) -> Callable[[Message], Awaitable[None]]:
            async def handler(message: Message) -> None:
                received[consumer][message.message_id] = message

            return handler

        def arrived() -> set[str]:
            return received["first"].keys() | received["second"].keys()

        expected: dict[str, tuple[bytes, str, dict[str, str]]] = {}
        async with (
            client.subscribe(subscription, handler_for("first"), consumer="first"),
            client.subscribe(subscription, handler_for("second"), consumer="second"),
        ):
            for start in range(0, count, chunk):
                outgoing = [
                    OutgoingMessage(
                        data=f"message {i} of {count}".encode(),
                        ordering_key=f"key-{i % keys}",
                        attributes={"i": str(i)},
                    )
                    for i in range(start, min(start + chunk, count))
                ]
                ids = await client.publish_many(topic, outgoing)
                if len(ids) != len(outgoing):
                    raise AssertionError(
                        f"publish_many of {len(outgoing)} messages returned {len(ids)} ids"
                    )
                for i, message_id in enumerate(ids, start):
                    expected[message_id] = (
                        f"message {i} of {count}".encode(),
                        f"key-{i % keys}",
                        {"i": str(i)},
                    )
            if len(expected) != count:
                raise AssertionError(
                    f"publishing {count} messages returned {len(expected)} distinct ids"
                )
            await _wait_until(
                lambda: len(arrived()) >= count,
                lambda: f"{len(arrived())} of {count} messages arrived",
                timeout=_BULK_ARRIVAL_TIMEOUT,
            )

        unexpected = sorted(arrived() - expected.keys())
        if unexpected:
            raise AssertionError(
                f"{len(unexpected)} received ids were never published, e.g. {unexpected[:3]}"
            )
        for consumer, messages in received.items():
            for message_id, message in messages.items():
                data, key, attributes = expected[message_id]
                # A publish under an OpenTelemetry SDK carries its trace context too.
                carried = {
                    name: value
                    for name, value in message.attributes.items()
                    if name not in _TRACE_CONTEXT
                }
                if (message.data, message.ordering_key, carried) != (data, key, attributes):
                    raise AssertionError(
                        f"message {message_id} arrived at {consumer!r} as {message!r}; it was "
                        f"published with data={data!r}, ordering_key={key!r}, "
                        f"attributes={attributes!r}"
                    )
                wanted = fnv1a_32(key.encode()) % partitions
                if _partition_of(message_id) != wanted:
                    raise AssertionError(
                        f"message {message_id} with ordering key {key!r} is in partition "
                        f"{_partition_of(message_id)}, not fnv1a_32(key) % {partitions} = {wanted}"
                    )
        shares = {consumer: len(messages) for consumer, messages in received.items()}
        if not all(shares.values()):
            raise AssertionError(
                f"both subscribers of one subscription should share the work, got {shares}"
            )


async def check_publish_returns_ids(client: Client) -> None:
    """publish returns ids '<partition>-<ms>-<seq>' that come back as message_id, with a
    publish_time near now, delivery_attempt 1 and the ordering key; keyless messages
    spread over more than one partition."""
    async with _topic(client, "ids") as topic:
        subscription = _name("ids")
        await client.create_subscription(subscription, topic=topic)
        received: dict[str, Message] = {}

        async def handler(message: Message) -> None:
            received[message.message_id] = message

        async with client.subscribe(subscription, handler):
            before = time.time()
            keyed = await client.publish(topic, b"keyed", ordering_key="customer-7")
            keyless = [await client.publish(topic, f"keyless {i}".encode()) for i in range(8)]
            after = time.time()
            published = [keyed, *keyless]
            for message_id in published:
                match = _ID.fullmatch(message_id) if isinstance(message_id, str) else None
                if match is None:
                    raise AssertionError(
                        f"publish returned {message_id!r}, not '<partition>-<ms>-<seq>'"
                    )
                if not 0 <= int(match.group(1)) < 16:
                    raise AssertionError(f"id {message_id!r} names a partition outside 0..15")
                millis = int(match.group(2)) / 1000
                if not before - _CLOCK_SKEW <= millis <= after + _CLOCK_SKEW:
                    raise AssertionError(
                        f"id {message_id!r} carries time {millis:.3f}, not near now ({after:.3f})"
                    )
            if len(set(published)) != len(published):
                raise AssertionError(f"publish returned duplicate ids: {published}")
            await _wait_until(
                lambda: len(received) >= len(published),
                lambda: f"received {sorted(received)}, published {published}",
            )

        missing = set(published) - received.keys()
        if missing:
            raise AssertionError(f"ids {sorted(missing)} were published but never received")
        now = datetime.datetime.now(datetime.UTC)
        for message_id in published:
            message = received[message_id]
            if message.message_id != message_id:
                raise AssertionError(f"message_id {message.message_id!r} != {message_id!r}")
            if message.publish_time.tzinfo is None:
                raise AssertionError(f"publish_time {message.publish_time!r} has no time zone")
            skew = abs((now - message.publish_time).total_seconds())
            if skew > _CLOCK_SKEW:
                raise AssertionError(
                    f"message {message_id} has publish_time {message.publish_time}, {skew:.1f} s "
                    f"from now ({now})"
                )
            if message.delivery_attempt != 1:
                raise AssertionError(
                    f"message {message_id} arrived first with delivery_attempt "
                    f"{message.delivery_attempt}, not 1"
                )
        if received[keyed].ordering_key != "customer-7":
            raise AssertionError(
                f"ordering key 'customer-7' came back as {received[keyed].ordering_key!r}"
            )
        if received[keyed].data != b"keyed":
            raise AssertionError(f"data b'keyed' came back as {received[keyed].data!r}")
        for message_id in keyless:
            if received[message_id].ordering_key is not None:
                raise AssertionError(
                    f"keyless message {message_id} came back with ordering key "
                    f"{received[message_id].ordering_key!r}, not None"
                )
        used = {_partition_of(message_id) for message_id in keyless}
        if len(used) < 2:
            raise AssertionError(
                f"8 keyless messages published one by one all went to partition(s) {used}; "
                "keyless messages should spread over partitions"
            )


async def check_start_latest_vs_earliest(client: Client) -> None:
    """A subscription created with start='latest' does not get messages published before
    it was created; one created with start='earliest' does."""
    async with _topic(client, "start") as topic:
        before = await client.publish(topic, b"before")
        latest, earliest = _name("latest"), _name("earliest")
        await client.create_subscription(latest, topic=topic, start="latest")
        await client.create_subscription(earliest, topic=topic, start="earliest")
        after = await client.publish(topic, b"after")
        got: dict[str, list[str]] = {latest: [], earliest: []}

        async def handler(message: Message) -> None:
            got[message.subscription].append(message.message_id)

        async with (
            client.subscribe(latest, handler),
            client.subscribe(earliest, handler),
        ):
            await _wait_until(
                lambda: len(got[earliest]) >= 2 and len(got[latest]) >= 1,
                lambda: (
                    f"start='earliest' got {got[earliest]}, start='latest' got "
                    f"{got[latest]}; published {before} before and {after} after creating them"
                ),
            )
            await asyncio.sleep(_QUIET)

        if sorted(got[earliest]) != sorted([before, after]):
            raise AssertionError(
                f"start='earliest' should get {before} and {after} once each, got {got[earliest]}"
            )
        if got[latest] != [after]:
            raise AssertionError(
                f"start='latest' should get only {after} (published after it was created), "
                f"got {got[latest]}"
            )


async def check_manual_ack_and_nack(client: Client) -> None:
    """With ack_mode='manual', an acked message is not delivered again and a nacked one
    is, with delivery_attempt 2."""
    async with _topic(client, "manual") as topic:
        subscription = _name("manual")
        await client.create_subscription(subscription, topic=topic, ack_deadline=_SHORT_DEADLINE)
        deliveries: list[tuple[bytes, int]] = []
        nacked_at: list[float] = []
        redelivered_after: list[float] = []

        async def handler(message: Message) -> None:
            deliveries.append((message.data, message.delivery_attempt))
            if message.data == b"nack me" and message.delivery_attempt == 1:
                nacked_at.append(time.monotonic())
                message.nack()
            else:
                if message.data == b"nack me" and nacked_at:
                    redelivered_after.append(time.monotonic() - nacked_at[0])
                message.ack()

        async with client.subscribe(subscription, handler, ack_mode="manual"):
            await client.publish_many(topic, [b"ack me", b"and me", b"nack me"])
            await _wait_until(
                lambda: (b"nack me", 2) in deliveries,
                lambda: f"the nacked message was not delivered again; deliveries: {deliveries}",
            )
            # Long enough for the reclaimer to take anything left unacked.
            await asyncio.sleep(_SHORT_DEADLINE * 1.5)

        want = [(b"ack me", 1), (b"and me", 1), (b"nack me", 1), (b"nack me", 2)]
        if sorted(deliveries) != want:
            raise AssertionError(
                f"acked messages should arrive once and the nacked one twice: want {want}, "
                f"got {sorted(deliveries)}"
            )
        # Without a retry policy a nack redelivers at once; a nack that does
        # nothing would leave the message until its ack deadline runs out.
        if redelivered_after[0] >= _SHORT_DEADLINE:
            raise AssertionError(
                f"a nacked message came again {redelivered_after[0]:.2f} s after the nack, not "
                f"before its ack deadline ({_SHORT_DEADLINE} s): the nack had no effect"
            )


async def check_auto_ack_exception_nacks(client: Client) -> None:
    """With ack_mode='auto', a handler that raises nacks: the message comes again with
    delivery_attempt 2, and once the handler returns it is not delivered again."""
    async with _topic(client, "raises") as topic:
        subscription = _name("raises")
        await client.create_subscription(subscription, topic=topic, ack_deadline=_SHORT_DEADLINE)
        attempts: list[int] = []
        times: list[float] = []

        async def handler(message: Message) -> None:
            attempts.append(message.delivery_attempt)
            times.append(time.monotonic())
            if message.delivery_attempt == 1:
                raise RuntimeError("conformance check: fail the first attempt on purpose")

        async with client.subscribe(subscription, handler):
            await client.publish(topic, b"fails once")
            await _wait_until(
                lambda: 2 in attempts,
                lambda: (
                    f"a handler raised and the message did not come again; attempts: {attempts}"
                ),
            )
            await asyncio.sleep(_SHORT_DEADLINE * 1.5)

        if attempts != [1, 2]:
            raise AssertionError(
                f"want delivery attempts [1, 2] (raise, then return), got {attempts}"
            )
        if times[1] - times[0] >= _SHORT_DEADLINE:
            raise AssertionError(
                f"a message whose handler raised came again {times[1] - times[0]:.2f} s later, "
                f"not before its ack deadline ({_SHORT_DEADLINE} s): it was not nacked"
            )


async def check_sync_handler(client: Client) -> None:
    """A plain ``def`` handler gets messages, run outside the event loop's thread, and
    returning from it acks them."""
    async with _topic(client, "sync") as topic:
        subscription = _name("sync")
        await client.create_subscription(subscription, topic=topic)
        loop_thread = threading.get_ident()
        got: list[tuple[bytes, int]] = []

        def handler(message: Message) -> None:
            got.append((message.data, threading.get_ident()))

        async with client.subscribe(subscription, handler):
            await client.publish_many(topic, [b"one", b"two", b"three"])
            await _wait_until(lambda: len(got) >= 3, lambda: f"a sync handler got {got}")
        stats = await client.subscription_stats(subscription)

        if sorted(data for data, _ in got) != [b"one", b"three", b"two"]:
            raise AssertionError(f"a sync handler should get each message once, got {got}")
        if any(thread == loop_thread for _, thread in got):
            raise AssertionError("a sync handler ran on the event loop's thread, blocking it")
        if stats.pending != 0:
            raise AssertionError(
                f"{stats.pending} messages are still pending after a sync handler returned"
            )


async def check_flow_control_bounds_concurrency(client: Client) -> None:
    """With FlowControl(max_messages=5) no more than 5 handlers run at once, and every
    message still arrives."""
    limit, count = 5, 60
    async with _topic(client, "flow") as topic:
        subscription = _name("flow")
        await client.create_subscription(subscription, topic=topic)
        running = peak = 0
        done: set[bytes] = set()

        async def handler(message: Message) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            try:
                await asyncio.sleep(0.03)
            finally:
                running -= 1
            done.add(message.data)

        async with client.subscribe(
            subscription, handler, flow_control=FlowControl(max_messages=limit)
        ):
            # Distinct keys spread one batch over the partitions, so one read
            # over all partitions returns more than the limit: the excess must wait.
            await client.publish_many(
                topic,
                [
                    OutgoingMessage(data=f"m{i}".encode(), ordering_key=f"k{i}")
                    for i in range(count)
                ],
            )
            await _wait_until(
                lambda: len(done) >= count,
                lambda: f"{len(done)} of {count} messages were handled",
            )

        if peak > limit:
            raise AssertionError(
                f"FlowControl(max_messages={limit}) let {peak} handlers run at once"
            )
        if done != {f"m{i}".encode() for i in range(count)}:
            raise AssertionError(f"handled {len(done)} distinct messages, want {count}")


async def check_stop_flushes_acks(client: Client) -> None:
    """Leaving the subscribe block sends the acks of every handled message: nothing stays
    pending and a new subscriber gets nothing again."""
    count = 20
    async with _topic(client, "stop") as topic:
        subscription = _name("stop")
        await client.create_subscription(subscription, topic=topic, ack_deadline=_SHORT_DEADLINE)
        handled: list[str] = []

        async def handler(message: Message) -> None:
            handled.append(message.message_id)

        async with client.subscribe(subscription, handler, consumer="first"):
            await client.publish_many(topic, [f"m{i}".encode() for i in range(count)])
            await _wait_until(
                lambda: len(handled) >= count,
                lambda: f"{len(handled)} of {count} messages were handled",
            )
        # No sleep here: the acks must be sent by leaving the block, not by a timer.
        stats = await client.subscription_stats(subscription)
        if stats.pending != 0:
            raise AssertionError(
                f"after leaving subscribe(), {stats.pending} of {count} handled messages are "
                "still pending: the acks were not flushed"
            )

        again: list[str] = []

        async def second(message: Message) -> None:
            again.append(message.message_id)

        async with client.subscribe(subscription, second, consumer="second"):
            # Past the ack deadline, so the reclaimer would find anything left pending.
            await asyncio.sleep(_SHORT_DEADLINE * 1.5)
        if again:
            raise AssertionError(
                f"a new subscriber got {len(again)} messages that were handled and acked "
                f"already, e.g. {again[:3]}"
            )


CONFORMANCE_CHECKS: tuple[Check, ...] = (
    check_publish_returns_ids,
    check_start_latest_vs_earliest,
    check_manual_ack_and_nack,
    check_auto_ack_exception_nacks,
    check_sync_handler,
    check_flow_control_bounds_concurrency,
    check_stop_flushes_acks,
    check_end_to_end_ordering_keys,
)
"""Every conformance check, quick ones first."""
