"""StreamingPull as the official Python client drives it, through the gateway."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.subscriber import exceptions as sub_exceptions
from google.cloud.pubsub_v1.types import FlowControl, PublisherOptions
from google.protobuf import duration_pb2, field_mask_pb2
from google.pubsub_v1 import types as gapic

from tests.gateway._collect import AckingCollector

from .conftest import GatewayThread


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Return once ``condition()`` is true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def _setup(
    publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
    **settings: Any,
) -> tuple[str, str]:
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    publisher.create_topic(name=topic)
    subscriber.create_subscription(request={"name": name, "topic": topic, **settings})
    return topic, name


def test_ten_thousand_messages_with_attributes_and_ordering_keys(
    ordered_publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
) -> None:
    """10,000 messages with attributes and 20 ordering keys arrive whole, each key in
    publish order, through a flow-controlled streaming pull that acks them."""
    publisher = ordered_publisher
    topic, name = _setup(publisher, subscriber, project, enable_message_ordering=True)
    total, keys = 10_000, 20
    futures = [
        publisher.publish(
            topic, f"message {i}".encode(), ordering_key=f"key-{i % keys}", index=str(i)
        )
        for i in range(total)
    ]
    message_ids = {f.result(timeout=60) for f in futures}
    assert len(message_ids) == total
    lock = threading.Lock()
    seen: dict[int, str] = {}
    order: dict[str, list[int]] = collections.defaultdict(list)

    def callback(message: Any) -> None:
        index = int(message.attributes["index"])
        with lock:
            assert message.data == f"message {index}".encode()
            assert message.ordering_key == f"key-{index % keys}"
            assert message.delivery_attempt is None  # no dead-letter policy
            if index not in seen:
                order[message.ordering_key].append(index)
            seen[index] = message.message_id
        message.ack()

    future = subscriber.subscribe(
        name, callback, flow_control=FlowControl(max_messages=200, max_bytes=10 * 2**20)
    )
    try:
        wait_for(lambda: len(seen) == total, 120, f"{total} messages")
    finally:
        future.cancel()
        future.result(timeout=30)
    assert set(seen.values()) == message_ids
    for key, indices in order.items():
        assert indices == sorted(indices), f"{key} out of order"


def test_nack_is_redelivered_without_delivery_attempt(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """A nacked message (ModifyAckDeadline 0) comes back, and without a dead-letter
    policy delivery_attempt stays unset."""
    topic, name = _setup(publisher, subscriber, project)
    ids = {publisher.publish(topic, b"x%d" % i).result() for i in range(50)}
    deliveries: dict[str, int] = collections.Counter()
    lock = threading.Lock()

    def callback(message: Any) -> None:
        assert message.delivery_attempt is None
        with lock:
            deliveries[message.message_id] += 1
            first = deliveries[message.message_id] == 1
        if first:
            message.nack()
        else:
            message.ack()

    future = subscriber.subscribe(name, callback)
    try:
        wait_for(
            lambda: len(deliveries) == 50 and all(n >= 2 for n in deliveries.values()),
            30,
            "every message delivered twice",
        )
    finally:
        future.cancel()
        future.result(timeout=30)
    assert set(deliveries) == ids


def test_dead_letter_policy_counts_attempts_and_moves_the_message(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Under a dead-letter policy delivery_attempt grows 1..5 on each nack, then the
    message moves to the dead-letter topic with its data and attributes."""
    dead_topic = f"projects/{project}/topics/dead"
    publisher.create_topic(name=dead_topic)
    dead_sub = f"projects/{project}/subscriptions/dead-reader"
    subscriber.create_subscription(name=dead_sub, topic=dead_topic)
    topic, name = _setup(
        publisher,
        subscriber,
        project,
        dead_letter_policy={"dead_letter_topic": dead_topic, "max_delivery_attempts": 5},
        retry_policy={
            "minimum_backoff": duration_pb2.Duration(nanos=100_000_000),
            "maximum_backoff": duration_pb2.Duration(nanos=200_000_000),
        },
    )
    count = 20
    ids = {
        publisher.publish(topic, b"poison %d" % i, kind="poison").result(): i for i in range(count)
    }
    attempts: dict[str, list[int]] = collections.defaultdict(list)
    lock = threading.Lock()

    def always_nack(message: Any) -> None:
        with lock:
            attempts[message.message_id].append(message.delivery_attempt)
        message.nack()

    dead: dict[str, Any] = {}

    def collect(message: Any) -> None:
        with lock:
            dead[message.attributes["streamsub.source_message_id"]] = message
        message.ack()

    future = subscriber.subscribe(name, always_nack)
    dead_future = subscriber.subscribe(dead_sub, collect)
    try:
        wait_for(lambda: len(dead) == count, 60, "every message dead-lettered")
    finally:
        for f in (future, dead_future):
            f.cancel()
            f.result(timeout=30)
    assert set(dead) == set(ids)
    for message_id, seen in attempts.items():
        assert seen == [1, 2, 3, 4, 5], message_id
    for source_id, message in dead.items():
        assert message.data == b"poison %d" % ids[source_id]
        assert message.attributes["kind"] == "poison"
        assert message.attributes["streamsub.delivery_attempts"] == "5"


def test_exactly_once_ack_after_the_lease_moved_fails(
    publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
    redis_client: redis.Redis,
) -> None:
    """With exactly-once delivery, acking a delivery whose lease moved to a newer
    delivery fails with INVALID_ACK_ID; the newer delivery's ack succeeds."""
    topic, name = _setup(publisher, subscriber, project, enable_exactly_once_delivery=True)
    message_id = publisher.publish(topic, b"once").result()
    partition, entry_id = message_id.split("-", 1)
    stream, group = f"ss:{{{project}~orders.{partition}}}", f"{project}~billing"
    held: list[Any] = []

    def callback(message: Any) -> None:
        held.append(message)

    def delivery_count() -> int:
        pending = redis_client.xpending_range(stream, group, entry_id, entry_id, 1)
        return int(pending[0]["times_delivered"]) if pending else 0

    future = subscriber.subscribe(name, callback, flow_control=FlowControl(max_messages=1))
    try:
        wait_for(lambda: held, 30, "the first delivery")
        first = held[0]
        assert first.message_id == message_id
        # The lease moves: the first delivery is given back and delivered anew.
        subscriber.modify_ack_deadline(
            subscription=name, ack_ids=[first.ack_id], ack_deadline_seconds=0
        )
        wait_for(lambda: delivery_count() == 2, 30, "the second delivery")
        with pytest.raises(sub_exceptions.AcknowledgeError) as failure:
            first.ack_with_response().result(timeout=30)
        assert failure.value.error_code == sub_exceptions.AcknowledgeStatus.INVALID_ACK_ID
        wait_for(lambda: len(held) == 2, 30, "the second delivery in the callback")
        assert held[1].message_id == message_id
        assert held[1].ack_with_response().result(timeout=30) == (
            sub_exceptions.AcknowledgeStatus.SUCCESS
        )
    finally:
        future.cancel()
        future.result(timeout=30)
    assert delivery_count() == 0
    assert not subscriber.pull(subscription=name, max_messages=10).received_messages


def _publish(publisher: pubsub_v1.PublisherClient, topic: str, count: int, size: int = 8) -> None:
    for future in [publisher.publish(topic, bytes(size)) for _ in range(count)]:
        future.result(timeout=60)


class _RawStream:
    """A StreamingPull opened by hand: requests are sent when put; responses collected."""

    def __init__(self, subscriber: pubsub_v1.SubscriberClient, first: Any) -> None:
        self._requests: collections.deque[Any] = collections.deque([first])
        self._wake = threading.Condition()
        self._done = False
        self.responses: list[Any] = []
        self.error: BaseException | None = None
        self._stream = subscriber.streaming_pull(requests=self._generate())
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _generate(self) -> Iterator[Any]:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._requests or self._done)
                if not self._requests:
                    return
                request = self._requests.popleft()
            yield request

    def _collect(self) -> None:
        try:
            for response in self._stream:
                self.responses.append(response)
        except BaseException as exc:
            self.error = exc

    def send(self, request: Any) -> None:
        with self._wake:
            self._requests.append(request)
            self._wake.notify_all()

    def messages(self) -> list[Any]:
        return [m for r in self.responses for m in r.received_messages]

    def close(self) -> None:
        with self._wake:
            self._done = True
            self._wake.notify_all()
        self._thread.join(10)


def test_server_honours_max_outstanding_and_answers_keepalives(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """The gateway delivers no more than the stream's max_outstanding_messages until
    some are acked, answers an empty keep-alive request, and puts
    subscription_properties on every response."""
    topic, name = _setup(publisher, subscriber, project, enable_message_ordering=True)
    for future in [publisher.publish(topic, b"m%d" % i) for i in range(300)]:
        future.result()
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name,
            stream_ack_deadline_seconds=60,
            client_id="raw",
            max_outstanding_messages=40,
        ),
    )
    try:
        wait_for(lambda: len(stream.messages()) >= 40, 30, "40 messages")
        time.sleep(1.0)  # the gateway would deliver more now if it did not count
        assert len(stream.messages()) == 40
        before = len(stream.responses)
        stream.send(gapic.StreamingPullRequest())
        wait_for(lambda: len(stream.responses) > before, 10, "the keep-alive's answer")
        assert not stream.responses[before].received_messages
        assert all(r.subscription_properties.message_ordering_enabled for r in stream.responses)
        assert not any(
            r.subscription_properties.exactly_once_delivery_enabled for r in stream.responses
        )
        acked = [m.ack_id for m in stream.messages()[:10]]
        subscriber.acknowledge(subscription=name, ack_ids=acked)
        wait_for(lambda: len(stream.messages()) >= 50, 30, "10 more messages after 10 acks")
        time.sleep(0.5)
        assert len(stream.messages()) == 50
        stream.send(gapic.StreamingPullRequest(ack_ids=[m.ack_id for m in stream.messages()]))
        wait_for(lambda: len(stream.messages()) >= 90, 30, "acks on the stream to free room")
    finally:
        stream.close()
    assert stream.error is None


def test_streams_end_at_their_lifetime_without_losing_messages(
    server: Any, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream ended by its lifetime is reopened by the client, and every message
    published meanwhile arrives."""
    # 2.5 s: the client reopens at most 5 streams in 10 s.
    gateway = GatewayThread(server.url, stream_lifetime=2.5)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", gateway.host)
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    try:
        topic, name = _setup(publisher, subscriber, project)
        callback = AckingCollector()
        received = callback.ids

        future = subscriber.subscribe(name, callback)
        published: set[str] = set()
        started = time.monotonic()
        # At least 6 s, and on until the stream was reopened twice (later on a
        # busy machine): messages are published across both reopenings.
        while time.monotonic() - started < 6.0 or gateway.gateway.statistics().streams_opened < 3:
            assert time.monotonic() - started < 60, "the stream was not reopened twice in 60 s"
            batch = [publisher.publish(topic, b"t%d" % i) for i in range(100)]
            published |= {f.result() for f in batch}
            time.sleep(0.1)
        wait_for(lambda: received >= published, 60, "every message")
        future.cancel()
        future.result(timeout=30)
        assert gateway.gateway.statistics().streams_opened >= 3
    finally:
        subscriber.close()
        publisher.stop()
        gateway.stop()


def test_acks_and_modacks_on_the_stream_are_confirmed_under_exactly_once(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Acks and modacks sent on the stream itself (as Java's client does) settle
    messages, and under exactly-once delivery each is confirmed on the stream, with
    stale ack ids listed as invalid."""
    topic, name = _setup(publisher, subscriber, project, enable_exactly_once_delivery=True)
    ids = {f.result() for f in [publisher.publish(topic, b"j%d" % i) for i in range(30)]}
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name, stream_ack_deadline_seconds=60, max_outstanding_messages=100
        ),
    )
    try:
        wait_for(lambda: len(stream.messages()) >= 30, 30, "30 messages")
        messages = stream.messages()
        assert {m.message.message_id for m in messages} == ids
        assert all(
            r.subscription_properties.exactly_once_delivery_enabled for r in stream.responses
        )
        ack_ids = [m.ack_id for m in messages]
        stream.send(
            gapic.StreamingPullRequest(
                modify_deadline_ack_ids=ack_ids[:10], modify_deadline_seconds=[120] * 10
            )
        )
        wait_for(
            lambda: any(r.modify_ack_deadline_confirmation.ack_ids for r in stream.responses),
            10,
            "the modack confirmation",
        )
        stale = ack_ids[0].replace("/1/", "/7/", 1)
        stream.send(gapic.StreamingPullRequest(ack_ids=[*ack_ids, stale]))
        wait_for(
            lambda: any(r.acknowledge_confirmation.ack_ids for r in stream.responses),
            10,
            "the ack confirmation",
        )
        confirmation = next(
            r.acknowledge_confirmation
            for r in stream.responses
            if r.acknowledge_confirmation.ack_ids
        )
        assert sorted(confirmation.ack_ids) == sorted(ack_ids)
        assert list(confirmation.invalid_ack_ids) == [stale]
        modacked = next(
            r.modify_ack_deadline_confirmation
            for r in stream.responses
            if r.modify_ack_deadline_confirmation.ack_ids
        )
        assert sorted(modacked.ack_ids) == sorted(ack_ids[:10])
    finally:
        stream.close()
    assert stream.error is None
    assert not subscriber.pull(subscription=name, max_messages=10).received_messages


def test_server_honours_max_outstanding_bytes(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """With max_outstanding_bytes of 3,000 and 300-byte messages, the gateway holds no
    more than 3,000 bytes out until some are acked."""
    topic, name = _setup(publisher, subscriber, project)
    for future in [publisher.publish(topic, bytes(300)) for i in range(100)]:
        future.result()
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name,
            stream_ack_deadline_seconds=60,
            max_outstanding_messages=1000,
            max_outstanding_bytes=3000,
        ),
    )
    try:
        wait_for(lambda: len(stream.messages()) >= 5, 30, "the first messages")
        time.sleep(1.0)  # the gateway would deliver more now if it did not count bytes
        held = len(stream.messages())
        assert 5 <= held <= 10
        subscriber.acknowledge(subscription=name, ack_ids=[m.ack_id for m in stream.messages()])
        wait_for(lambda: len(stream.messages()) > held, 30, "more after the acks")
        time.sleep(0.5)
        assert len(stream.messages()) - held <= 10
    finally:
        stream.close()
    assert stream.error is None


def test_ordered_subscription_gives_each_key_to_one_stream_in_order(
    gateway: GatewayThread, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Two streams of an ordered subscription share the work, yet each ordering key's
    messages all go to one stream, in publish order."""
    publisher = pubsub_v1.PublisherClient(
        publisher_options=PublisherOptions(enable_message_ordering=True)
    )
    topic, name = _setup(publisher, subscriber, project, enable_message_ordering=True)
    waves, per_wave, keys = 6, 300, 30
    total = waves * per_wave
    first = gapic.StreamingPullRequest(
        subscription=name, stream_ack_deadline_seconds=60, max_outstanding_messages=1000
    )
    opened = gateway.gateway.statistics().streams_opened
    streams = [_RawStream(subscriber, first), _RawStream(subscriber, first)]
    try:
        # Both streams share the partitions from the start: a stream that joins
        # later waits for partitions whose messages the other still holds.
        wait_for(
            lambda: gateway.gateway.statistics().streams_opened >= opened + 2,
            10,
            "both streams to open",
        )
        # A read the first stream began alone covers every partition; it ends
        # within 0.5 s. (What it took would wait for acks before the second
        # stream took those partitions over, and this test does not ack.)
        time.sleep(1.0)
        # In waves, so that each key's messages come in several publish batches
        # which, without ownership, either stream could take.
        for wave in range(waves):
            futures = [
                publisher.publish(topic, b"o", ordering_key=f"key-{i % keys}", index=str(i))
                for i in range(wave * per_wave, (wave + 1) * per_wave)
            ]
            for future in futures:
                future.result()
            time.sleep(0.05)
        wait_for(lambda: sum(len(s.messages()) for s in streams) >= total, 30, "every message")
        owner: dict[str, int] = {}
        for number, stream in enumerate(streams):
            assert stream.messages(), "one stream got nothing"
            order: dict[str, list[int]] = collections.defaultdict(list)
            for item in stream.messages():
                key = item.message.ordering_key
                assert owner.setdefault(key, number) == number, f"{key} on both streams"
                order[key].append(int(item.message.attributes["index"]))
            for key, indices in order.items():
                assert indices == sorted(indices), f"{key} out of order"
        assert len(owner) == keys
    finally:
        for stream in streams:
            stream.close()
        publisher.stop()


def test_deleting_the_subscription_ends_its_streams_with_not_found(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """A subscription deleted while the client streams it ends the stream with
    NOT_FOUND, which the client reports as its NotFound exception."""
    _, name = _setup(publisher, subscriber, project)
    future = subscriber.subscribe(name, lambda message: message.ack())
    wait_for(lambda: future.running(), 10, "the stream")
    time.sleep(0.5)  # the stream is open and reading
    subscriber.delete_subscription(subscription=name)
    with pytest.raises(exceptions.NotFound):
        future.result(timeout=30)


@pytest.mark.parametrize(
    "limits",
    [
        {"max_outstanding_messages": -1},
        {"max_outstanding_bytes": -1},
    ],
    ids=["messages=-1", "bytes=-1"],
)
def test_negative_flow_control_means_no_limit(
    publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
    limits: dict[str, int],
) -> None:
    """A negative max_outstanding_messages or max_outstanding_bytes is "no limit"
    (Go's client sends a negative ReceiveSettings.MaxOutstandingMessages/Bytes as
    is, documented as "no limit"): the stream must deliver. The gateway used to compute a
    negative budget and delivers nothing, for ever."""
    topic, name = _setup(publisher, subscriber, project)
    _publish(publisher, topic, 20)
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(subscription=name, stream_ack_deadline_seconds=60, **limits),
    )
    try:
        wait_for(lambda: len(stream.messages()) >= 20, 10, "20 messages on an unlimited stream")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {len(stream.messages())} delivered") from None
    finally:
        stream.close()


def test_max_outstanding_bytes_is_not_overshot_by_large_messages(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """With max_outstanding_bytes = 256 KiB and 64 KiB messages, at most about four
    (one more at most) may be out before acks. The gateway used to size its first read by
    an assumed 1 KiB per message and sends all 40 (2.5 MiB, ten times the limit):
    exactly the pile-up the issue says server-side flow control must prevent."""
    topic, name = _setup(publisher, subscriber, project)
    size = 64 * 1024
    _publish(publisher, topic, 40, size)
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name,
            stream_ack_deadline_seconds=60,
            max_outstanding_messages=1000,
            max_outstanding_bytes=256 * 1024,
        ),
    )
    try:
        wait_for(lambda: stream.messages(), 20, "the first messages")
        time.sleep(1.5)  # what the gateway sends before any ack
        out = sum(len(m.message.data) for m in stream.messages())
        assert out <= 256 * 1024 + size, (
            f"{len(stream.messages())} messages, {out} bytes out against a 262,144-byte limit"
        )
    finally:
        stream.close()


def test_messages_with_attributes_reach_the_official_client(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """1,000 messages of 100 bytes with eight 1,000-character attributes each (well
    within Pub/Sub's limits of 100 attributes of 1,024 bytes) all arrive through a
    default streaming pull of the official client."""
    topic, name = _setup(publisher, subscriber, project)
    attributes = {f"meta{i}": "v" * 1000 for i in range(8)}
    futures = [publisher.publish(topic, bytes(100), **attributes) for _ in range(1000)]
    published = {f.result(timeout=60) for f in futures}
    callback = AckingCollector()
    received = callback.ids

    future = subscriber.subscribe(name, callback)
    try:
        wait_for(
            lambda: received >= published or not future.running(),
            25,
            "every message with attributes",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {len(received)} of {len(published)} arrived") from None
    finally:
        future.cancel()
        future.result(timeout=30)
    assert received == published


def test_zero_max_outstanding_messages_means_no_limit(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """The official Python client with legacy flow control sends
    max_outstanding_messages=0 ("no limit" on the server) and limits itself to its
    FlowControl(max_messages=1500): a callback that keeps 1,500 messages before
    acking them all (a batching consumer) gets them. The gateway used to cap a 0
    at 1,000 outstanding (StreamSettings.default_max_messages, in no README line),
    so such a consumer waits for ever."""
    topic, name = _setup(publisher, subscriber, project, ack_deadline_seconds=600)
    _publish(publisher, topic, 1500)
    held: list[Any] = []
    lock = threading.Lock()

    def keep(message: Any) -> None:
        with lock:
            held.append(message)

    future = subscriber.subscribe(
        name,
        keep,
        flow_control=FlowControl(max_messages=1500),
        use_legacy_flow_control=True,
    )
    try:
        wait_for(lambda: len(held) >= 1500, 25, "1,500 messages held before any ack")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {len(held)} held") from None
    finally:
        with lock:
            for message in held:
                message.ack()
        future.cancel()
        future.result(timeout=30)


def test_a_reconnecting_client_id_keeps_its_outstanding_messages(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """A stream that reconnects with the same client_id carries the old stream's
    state: its 10 unacked messages still count against max_outstanding_messages=10,
    so the new stream gets nothing until they are acked. The gateway used to ignore
    client_id (it only logs it) and gives the new stream a fresh budget: 20
    messages out against a limit of 10 (what a 30-minute stream end does to every
    client)."""
    topic, name = _setup(publisher, subscriber, project, ack_deadline_seconds=600)
    _publish(publisher, topic, 50)
    first = gapic.StreamingPullRequest(
        subscription=name,
        stream_ack_deadline_seconds=600,
        max_outstanding_messages=10,
        client_id="reconnecting-client",
    )
    old = _RawStream(subscriber, first)
    wait_for(lambda: len(old.messages()) >= 10, 20, "the first stream's 10 messages")
    old.close()
    new = _RawStream(subscriber, first)
    try:
        time.sleep(1.5)
        assert not new.messages(), (
            f"the reconnected stream got {len(new.messages())} more messages while the "
            "same client still holds 10 unacked ones"
        )
    finally:
        new.close()


@pytest.mark.parametrize("field", ["max_outstanding_messages", "max_outstanding_bytes"])
def test_flow_control_on_a_later_request_aborts_the_stream(
    publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
    field: str,
) -> None:
    """Flow-control limits on a request after the first abort the stream with
    INVALID_ARGUMENT (the proto's words). The gateway used to ignore them."""
    _, name = _setup(publisher, subscriber, project)
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name, stream_ack_deadline_seconds=60, max_outstanding_messages=5
        ),
    )
    try:
        time.sleep(0.5)
        stream.send(gapic.StreamingPullRequest(**{field: 50}))
        wait_for(lambda: stream.error is not None, 5, "the stream to be aborted")
        # The generated client raises the status as google.api_core's exception.
        assert isinstance(stream.error, exceptions.InvalidArgument), stream.error
    finally:
        stream.close()


def test_a_stream_takes_up_a_lowered_ack_deadline(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Streams read with the subscription's ack deadline as it is now: after it
    is lowered from 600 s to 10 s, 20 messages a stream (stream deadline 10 s)
    received and never acked come back on that stream once their 10-second
    leases end, not ten minutes later (what an open stream's deadline of 600 s
    would make of them)."""
    topic, name = _setup(publisher, subscriber, project, ack_deadline_seconds=600)
    _publish(publisher, topic, 20)
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name, stream_ack_deadline_seconds=10, max_outstanding_messages=100
        ),
    )
    try:
        wait_for(lambda: len(stream.messages()) >= 20, 20, "the 20 first deliveries")
        subscriber.update_subscription(
            request={
                "subscription": {"name": name, "ack_deadline_seconds": 10},
                "update_mask": field_mask_pb2.FieldMask(paths=["ack_deadline_seconds"]),
            }
        )
        first = {m.message.message_id for m in stream.messages()}
        wait_for(lambda: len(stream.messages()) >= 40, 40, "the 20 messages again")
        again = {m.message.message_id for m in stream.messages()[20:]}
        assert again == first
    finally:
        stream.close()
