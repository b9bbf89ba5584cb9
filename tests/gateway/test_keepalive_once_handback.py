"""StreamingPull as the official clients drive it: keep-alives on an idle
stream, no duplicates under flow control, leases handed back on stop."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import pytest
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.types import FlowControl
from google.pubsub_v1 import types as gapic

from streamsub.testing import RedisServer
from tests.gateway.conftest import GatewayThread
from tests.gateway.test_streaming import _RawStream, _setup, wait_for


def test_a_keepalive_on_an_idle_stream_is_answered_within_seconds(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Java's client closes a stream that hears nothing for 15 s after its ping: on a
    stream with nothing to deliver (the gateway waiting in a blocking read) each of
    three keep-alives is answered within 5 s."""
    _setup(publisher, subscriber, project)
    name = f"projects/{project}/subscriptions/billing"
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name, stream_ack_deadline_seconds=60, client_id="java-like"
        ),
    )
    try:
        time.sleep(1.0)  # the gateway is now waiting for messages that never come
        for ping in range(3):
            before = len(stream.responses)
            sent = time.monotonic()
            stream.send(gapic.StreamingPullRequest())
            wait_for(lambda n=before: len(stream.responses) > n, 5, f"the answer to ping {ping}")
            assert time.monotonic() - sent < 5
        assert stream.messages() == []
    finally:
        stream.close()
    assert stream.error is None


def test_ten_thousand_flow_controlled_messages_arrive_once_each(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Issue 10: max_outstanding_* are honoured server-side "or clients pile up
    messages and they come back as duplicates": 10,000 messages streamed with
    FlowControl(max_messages=200) and acked at once are each delivered once."""
    topic, name = _setup(publisher, subscriber, project)
    total = 10_000
    futures = [publisher.publish(topic, b"m%d" % i) for i in range(total)]
    ids = {f.result(timeout=60) for f in futures}
    deliveries: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def callback(message: Any) -> None:
        with lock:
            deliveries[message.message_id] += 1
        message.ack()

    future = subscriber.subscribe(name, callback, flow_control=FlowControl(max_messages=200))
    try:
        wait_for(lambda: len(deliveries) == total, 120, f"{total} messages")
        time.sleep(2)  # any redelivery of an acked message would show by now
    finally:
        future.cancel()
        future.result(timeout=30)
    assert set(deliveries) == ids
    assert [m for m, n in deliveries.items() if n > 1] == []


def test_sigterm_hands_leases_back_at_once(server: RedisServer, project: str) -> None:
    """Issue 10, operations: a stopping gateway gives its leases back: messages a
    stream held unacknowledged under a 600-s ack deadline are pulled again from
    another gateway right after the stop, not 10 minutes later."""
    first: GatewayThread | None = GatewayThread(server.url)
    second: GatewayThread | None = None
    try:
        assert first is not None
        import grpc
        from google.pubsub_v1 import PublisherClient, SubscriberClient
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        def clients(host: str) -> tuple[Any, Any]:
            return (
                PublisherClient(
                    transport=PublisherGrpcTransport(channel=grpc.insecure_channel(host))
                ),
                SubscriberClient(
                    transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(host))
                ),
            )

        admin, sub = clients(first.host)
        topic = f"projects/{project}/topics/orders"
        name = f"projects/{project}/subscriptions/billing"
        admin.create_topic(name=topic)
        sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)
        published = set(
            admin.publish(
                topic=topic, messages=[gapic.PubsubMessage(data=b"x%d" % i) for i in range(50)]
            ).message_ids
        )
        stream = _RawStream(
            sub, gapic.StreamingPullRequest(subscription=name, stream_ack_deadline_seconds=600)
        )
        wait_for(lambda: len(stream.messages()) == 50, 30, "50 messages held by the stream")
        first.stop()
        first = None
        stream.close()
        second = GatewayThread(server.url)
        _, sub2 = clients(second.host)
        got: set[str] = set()
        deadline = time.monotonic() + 20
        while got != published and time.monotonic() < deadline:
            reply = sub2.pull(subscription=name, max_messages=100, timeout=10)
            got |= {m.message.message_id for m in reply.received_messages}
        assert got == published
    finally:
        if second is not None:
            second.stop()
        if first is not None:
            first.stop()


pytestmark = pytest.mark.timeout(240)
