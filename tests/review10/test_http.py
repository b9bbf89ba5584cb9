"""Review of issue 10: the HTTP port (REST mapping and gRPC-Web framing)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import httpx
import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1.types import pubsub

from tests.gateway.conftest import GatewayThread

_FRAME = struct.Struct(">BI")


@pytest.fixture
def http(gateway: GatewayThread) -> Iterator[httpx.Client]:
    """An httpx client on the gateway's HTTP port."""
    with httpx.Client(base_url=gateway.http, timeout=30) as client:
        yield client


def test_grpc_web_frame_longer_than_the_body_is_refused(
    http: httpx.Client, publisher: pubsub_v1.PublisherClient, project: str
) -> None:
    """A gRPC-Web frame whose length prefix says 100 bytes more than the body holds
    is a broken request and must fail (non-zero grpc-status). The gateway slices
    what there is, parses it, and runs the call: OK, and the topic exists."""
    name = f"projects/{project}/topics/framed"
    payload = pubsub.Topic.pb()(name=name).SerializeToString()
    response = http.post(
        "/google.pubsub.v1.Publisher/CreateTopic",
        content=_FRAME.pack(0, len(payload) + 100) + payload,
        headers={"content-type": "application/grpc-web+proto", "x-grpc-web": "1"},
    )
    assert b"grpc-status:0\r\n" not in response.content
    assert response.headers.get("grpc-status") not in (None, "0")
