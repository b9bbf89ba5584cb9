"""Review of issue 10: a nack sent to another gateway process than the one
streaming the message.

Behind nginx with several gateways in the upstream, or any client whose unary
calls and stream take different connections, the stream lives on one gateway
and the ModifyAckDeadline(0) reaches another. README, Ack ids name one delivery:
"an ack sent on any connection, to any gateway process, settles exactly that
delivery"; Leases: "ModifyAckDeadline 0 is a nack, redelivered after the retry
policy's backoff". The streaming gateway's lease table does not learn of the
nack and its next "extend" step (idle 0 while idle < the ack deadline) takes
back the nack's short backoff, holding the message until the stream's own
lease (60 s here) ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.cloud import pubsub_v1
from google.protobuf import duration_pb2
from google.pubsub_v1 import types as gapic
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from streamsub.testing import RedisServer
from tests.gateway.conftest import GatewayThread
from tests.gateway.test_streaming import _RawStream, _setup, wait_for


@pytest.fixture
def other_gateway(server: RedisServer) -> Iterator[GatewayThread]:
    """A second gateway on the same Redis: its own adapter, leases and consumers."""
    running = GatewayThread(server.url)
    yield running
    running.stop()


def test_a_nack_on_another_gateway_is_redelivered_after_its_backoff(
    publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    other_gateway: GatewayThread,
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
        transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(other_gateway.host))
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
