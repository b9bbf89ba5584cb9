"""Review of issue 10: StreamingPull responses the official Python client can read.

The official Python client, with PUBSUB_EMULATOR_HOST set, talks to the gateway
over ``grpc.insecure_channel(target=...)`` with gRPC's default 4 MiB limit on a
received message. The gateway cuts streaming responses at 3 MiB, but counts
only ``data`` and the ack id (plus 200 bytes) per message, never the attributes,
so messages with ordinary attributes make responses the client refuses
(RESOURCE_EXHAUSTED "Received message larger than max"), the stream fails, the
leases lapse, and the same oversized response is sent again.
Issue 10, Done when 1: "publishes 10,000 messages with attributes ... streaming-pulls them".
"""

from __future__ import annotations

import threading
from typing import Any

from google.cloud import pubsub_v1

from tests.gateway.test_streaming import _setup, wait_for


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
    received: set[str] = set()
    lock = threading.Lock()

    def callback(message: Any) -> None:
        with lock:
            received.add(message.message_id)
        message.ack()

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
