"""Browsers reach the front door over HTTP/2 (nginx offers
h2 through ALPN), so gRPC-Web and REST must pass nginx over h2 as well."""

from __future__ import annotations

import base64
import ssl
from collections.abc import Iterator

import httpx
import pytest
from google.pubsub_v1.types import pubsub

from tests.gateway.test_http import _GRPC_WEB, _frame, _frames
from tests.gateway.test_nginx import FrontDoor, front_door, grpc_web_stream  # noqa: F401 (fixture)


@pytest.fixture
def https2(front_door: FrontDoor) -> Iterator[httpx.Client]:  # noqa: F811
    """httpx over TLS to the front door, HTTP/2 only (as a browser that negotiates h2)."""
    with httpx.Client(
        base_url=f"https://localhost:{front_door.port}",
        verify=ssl.create_default_context(cafile=str(front_door.certificate)),
        http1=False,
        http2=True,
        timeout=30,
    ) as client:
        yield client


def test_rest_and_grpc_web_through_nginx_over_http2(https2: httpx.Client, project: str) -> None:
    """Over h2: REST creates and publishes, a gRPC-Web unary call answers with an OK
    trailer, a gRPC-Web server stream delivers every message, preflight is 204."""
    topic = f"projects/{project}/topics/orders"
    sub = f"projects/{project}/subscriptions/billing"
    created = https2.put(f"/v1/{topic}", json={})
    assert created.http_version == "HTTP/2"
    assert created.status_code == 200, created.text
    unary = https2.post(
        "/google.pubsub.v1.Subscriber/CreateSubscription",
        content=_frame(pubsub.Subscription.pb()(name=sub, topic=topic).SerializeToString()),
        headers={**_GRPC_WEB, "origin": "https://app.example"},
    )
    assert unary.http_version == "HTTP/2"
    messages, trailers = _frames(unary.content)
    assert trailers.get("grpc-status") == "0", (unary.status_code, unary.headers, unary.content)
    assert pubsub.Subscription.pb().FromString(messages[0]).topic == topic
    data = [{"data": base64.b64encode(b"h%d" % i).decode()} for i in range(100)]
    ids = set(https2.post(f"/v1/{topic}:publish", json={"messages": data}).json()["messageIds"])
    assert grpc_web_stream(https2, sub, ids) == ids
    preflight = https2.options(
        f"/v1/{topic}",
        headers={"origin": "https://app.example", "access-control-request-method": "PUT"},
    )
    assert preflight.status_code == 204
