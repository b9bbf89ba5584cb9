"""Ack ids settle exactly one delivery, whichever gateway process receives the ack."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.protobuf import duration_pb2
from google.pubsub_v1 import types as gapic
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from streamsub.testing import RedisServer

from .conftest import GatewayThread
from .test_streaming import _RawStream, _setup, wait_for


@pytest.fixture
def second_gateway(server: RedisServer) -> Iterator[GatewayThread]:
    """Another gateway process's worth of state: its own adapter, leases and consumers."""
    running = GatewayThread(server.url)
    yield running
    running.stop()


def _subscriber(host: str) -> pubsub_v1.SubscriberClient:
    channel = grpc.insecure_channel(host)
    return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


def test_ack_on_another_gateway_settles_exactly_that_delivery(
    publisher: pubsub_v1.PublisherClient,
    gateway: GatewayThread,
    second_gateway: GatewayThread,
    project: str,
) -> None:
    """A message pulled from one gateway and given back is acked through another: the
    stale ack id fails there with PERMANENT_FAILURE_INVALID_ACK_ID, the current one
    settles the message for good."""
    first, second = _subscriber(gateway.host), _subscriber(second_gateway.host)
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    publisher.create_topic(name=topic)
    first.create_subscription(
        request={"name": name, "topic": topic, "enable_exactly_once_delivery": True}
    )
    message_id = publisher.publish(topic, b"one").result()
    old = first.pull(subscription=name, max_messages=1).received_messages[0]
    assert old.message.message_id == message_id
    second.modify_ack_deadline(subscription=name, ack_ids=[old.ack_id], ack_deadline_seconds=0)
    new: list[object] = []

    def pulled() -> bool:
        new.extend(first.pull(subscription=name, max_messages=1).received_messages)
        return bool(new)

    wait_for(pulled, 30, "the redelivery")
    current = new[0]
    assert current.message.message_id == message_id  # type: ignore[attr-defined]
    with pytest.raises(exceptions.InvalidArgument) as failure:
        second.acknowledge(subscription=name, ack_ids=[old.ack_id])
    status = rpc_status.from_call(failure.value.response)
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert dict(info.metadata) == {old.ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID"}
    second.acknowledge(subscription=name, ack_ids=[current.ack_id])  # type: ignore[attr-defined]
    with pytest.raises(exceptions.InvalidArgument):
        first.acknowledge(subscription=name, ack_ids=[current.ack_id])  # type: ignore[attr-defined]
    assert not first.pull(subscription=name, max_messages=1).received_messages
    first.close()
    second.close()


def test_a_stopping_gateway_gives_its_leases_back(
    publisher: pubsub_v1.PublisherClient,
    gateway: GatewayThread,
    server: RedisServer,
    project: str,
) -> None:
    """Messages leased through a gateway that stops gracefully are delivered by
    another gateway at once, not when their 600 s ack deadline ends."""
    leaving = GatewayThread(server.url)
    first = _subscriber(leaving.host)
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    publisher.create_topic(name=topic)
    first.create_subscription(request={"name": name, "topic": topic, "ack_deadline_seconds": 600})
    ids = {f.result() for f in [publisher.publish(topic, b"x") for _ in range(20)]}
    leased: set[str] = set()

    def pulled_all() -> bool:
        response = first.pull(subscription=name, max_messages=20)
        leased.update(m.message.message_id for m in response.received_messages)
        return leased == ids

    wait_for(pulled_all, 30, "every message leased through the first gateway")
    first.close()
    leaving.stop()
    second = _subscriber(gateway.host)
    again: set[str] = set()

    def pulled_again() -> bool:
        response = second.pull(subscription=name, max_messages=20)
        again.update(m.message.message_id for m in response.received_messages)
        return again == ids

    wait_for(pulled_again, 30, "every message again through the other gateway")
    second.close()


def test_a_stale_nack_leaves_the_current_delivery_alone(
    publisher: pubsub_v1.PublisherClient, gateway: GatewayThread, project: str
) -> None:
    """A nack (ModifyAckDeadline 0) from an earlier delivery of a message, sent after
    the same consumer got it again, is checked against the delivery count: it fails
    with PERMANENT_FAILURE_INVALID_ACK_ID and gives nothing back, and the current
    delivery is then acked."""
    client = _subscriber(gateway.host)
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    publisher.create_topic(name=topic)
    client.create_subscription(
        request={"name": name, "topic": topic, "enable_exactly_once_delivery": True}
    )
    ids = {publisher.publish(topic, b"m%d" % i).result() for i in range(20)}
    first: dict[str, str] = {}

    def pulled_all() -> bool:
        for m in client.pull(subscription=name, max_messages=20).received_messages:
            first[m.message.message_id] = m.ack_id
        return set(first) == ids

    wait_for(pulled_all, 30, "every message")
    client.modify_ack_deadline(
        subscription=name, ack_ids=list(first.values()), ack_deadline_seconds=0
    )
    second: dict[str, str] = {}

    def pulled_again() -> bool:
        for m in client.pull(subscription=name, max_messages=20).received_messages:
            second[m.message.message_id] = m.ack_id
        return set(second) == ids

    wait_for(pulled_again, 30, "every message again")
    for message_id, ack_id in second.items():
        # Same consumer (this gateway's unary puller), the next delivery count.
        assert ack_id.split("/")[3] == first[message_id].split("/")[3]
        assert int(ack_id.split("/")[2]) == int(first[message_id].split("/")[2]) + 1
    with pytest.raises(exceptions.InvalidArgument) as failure:
        client.modify_ack_deadline(
            subscription=name, ack_ids=list(first.values()), ack_deadline_seconds=0
        )
    info = error_details_pb2.ErrorInfo()
    assert rpc_status.from_call(failure.value.response).details[0].Unpack(info)
    assert dict(info.metadata) == dict.fromkeys(first.values(), "PERMANENT_FAILURE_INVALID_ACK_ID")
    assert not client.pull(subscription=name, max_messages=20).received_messages
    client.acknowledge(subscription=name, ack_ids=list(second.values()))
    client.close()


def test_a_nack_on_another_gateway_is_redelivered_after_its_backoff(
    publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    second_gateway: GatewayThread,
    project: str,
) -> None:
    """A message streamed by one gateway (stream deadline 60 s, subscription ack
    deadline 10 s, retry backoff 5 s) and nacked through another comes back after
    its 5 seconds, not after the stream's 60-second lease."""
    topic, name = _setup(
        publisher,
        subscriber,
        project,
        retry_policy={
            "minimum_backoff": duration_pb2.Duration(seconds=5),
            "maximum_backoff": duration_pb2.Duration(seconds=5),
        },
    )
    message_id = publisher.publish(topic, b"nack me elsewhere").result(timeout=30)
    stream = _RawStream(
        subscriber,
        gapic.StreamingPullRequest(
            subscription=name, stream_ack_deadline_seconds=60, max_outstanding_messages=10
        ),
    )
    elsewhere = pubsub_v1.SubscriberClient(
        transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(second_gateway.host))
    )
    try:
        wait_for(stream.messages, 20, "the streamed delivery")
        first = stream.messages()[0]
        assert first.message.message_id == message_id
        elsewhere.modify_ack_deadline(
            subscription=name, ack_ids=[first.ack_id], ack_deadline_seconds=0
        )
        again: list[Any] = []

        def redelivered() -> bool:
            # To whichever puller: the stream itself, or a Pull on the other gateway.
            again.extend(stream.messages()[1:])
            again.extend(elsewhere.pull(subscription=name, max_messages=1).received_messages)
            return bool(again)

        wait_for(redelivered, 15, "the nacked message again, after its 5-second backoff")
        assert again[0].message.message_id == message_id
    finally:
        stream.close()
        elsewhere.close()
