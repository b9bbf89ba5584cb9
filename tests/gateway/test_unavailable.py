"""Redis going away behind the gateway: UNAVAILABLE, as Pub/Sub says it, not UNKNOWN."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

from streamsub.testing import redis_server

from .conftest import GatewayThread


def test_redis_down_is_unavailable_on_every_face(tmp_path: Path, project: str) -> None:
    """With its Redis stopped, the gateway answers gRPC calls with UNAVAILABLE and
    REST calls with 503 and status UNAVAILABLE; with Redis back, it serves again."""
    with redis_server(tmp_path) as server:
        gateway = GatewayThread(server.url)
        try:
            channel = grpc.insecure_channel(gateway.host)
            publisher = pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=channel))
            topic = f"projects/{project}/topics/orders"
            publisher.create_topic(name=topic)
            server.stop()
            with pytest.raises(exceptions.ServiceUnavailable):
                publisher.get_topic(topic=topic, retry=None)
            response = httpx.get(f"{gateway.http}/v1/{topic}", timeout=30)
            assert response.status_code == 503
            assert response.json()["error"]["status"] == "UNAVAILABLE"
            server.start()
            assert publisher.get_topic(topic=topic, retry=None).name == topic
            publisher.stop()
        finally:
            gateway.stop()
