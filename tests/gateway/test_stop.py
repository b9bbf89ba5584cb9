"""Stopping a gateway while clients reopen their streams at once.

A stopping gateway ends every stream with UNAVAILABLE and the clients open
another, at once. The official clients take CANCELLED (and NOT_FOUND,
INVALID_ARGUMENT, ...) as final: a reopened stream that the stopping gRPC
server cancels ends the client's subscriber for good (CI saw it happen to the
Python client in 1 of about 8 restarts).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest
from google.pubsub_v1 import PublisherClient, PubsubMessage, SubscriberClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from streamsub.gateway._proto import pb
from streamsub.testing import RedisServer

from .conftest import GatewayThread
from .test_streaming import wait_for

pytestmark = pytest.mark.timeout(120)

_METHOD = "/google.pubsub.v1.Subscriber/StreamingPull"
CLIENTS = 24


async def _reopen_until_refused(host: str, subscription: str, codes: Counter[str]) -> None:
    """Open StreamingPull after StreamingPull on one channel, as a client does after
    UNAVAILABLE, until nobody listens on ``host``; count how each ended."""
    first = pb.StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=10)
    async with grpc.aio.insecure_channel(host) as channel:
        open_stream = channel.stream_stream(
            _METHOD,
            request_serializer=pb.StreamingPullRequest.SerializeToString,
            response_deserializer=pb.StreamingPullResponse.FromString,
        )
        while True:
            call = open_stream()
            try:
                await call.write(first)  # and never half-close, as a client's stream
                while await call.read() is not grpc.aio.EOF:
                    pass
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    return
                if "connect" in (exc.details() or "").lower():
                    return  # refused: the gateway has stopped


def test_streams_reopened_during_stop_end_unavailable_never_cancelled(
    server: RedisServer, project: str
) -> None:
    """Two dozen clients reopen their stream the moment it ends while the gateway
    stops: every stream ends UNAVAILABLE, the clients' cue to open another; none
    CANCELLED, which ends a real client's subscriber for good."""
    gateway = GatewayThread(server.url)
    stopped = False
    try:
        admin = PublisherClient(
            transport=PublisherGrpcTransport(channel=grpc.insecure_channel(gateway.host))
        )
        topic = f"projects/{project}/topics/orders"
        subscription = f"projects/{project}/subscriptions/billing"
        admin.create_topic(name=topic)
        SubscriberClient(
            transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(gateway.host))
        ).create_subscription(name=subscription, topic=topic)
        for _ in range(5):  # leases for the streams to give back as they end
            admin.publish(topic=topic, messages=[PubsubMessage(data=b"x" * 100)] * 1000)
        codes: Counter[str] = Counter()

        async def scenario() -> None:
            nonlocal stopped
            clients = [
                asyncio.ensure_future(_reopen_until_refused(gateway.host, subscription, codes))
                for _ in range(CLIENTS)
            ]
            opened = lambda: gateway.gateway.statistics().streams_open >= CLIENTS  # noqa: E731
            await asyncio.to_thread(wait_for, opened, 30, "every client's stream")
            await asyncio.to_thread(gateway.stop)
            stopped = True
            await asyncio.wait_for(asyncio.gather(*clients), 60)

        asyncio.run(scenario())
    finally:
        if not stopped:
            gateway.stop()
    assert codes["UNAVAILABLE"] >= CLIENTS
    assert set(codes) == {"UNAVAILABLE"}, codes
