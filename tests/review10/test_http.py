"""Review of issue 10: the HTTP port (REST mapping and gRPC-Web framing)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import httpx
import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1.types import pubsub

from tests.gateway.conftest import GatewayThread
from tests.gateway.test_streaming import wait_for

_FRAME = struct.Struct(">BI")


@pytest.fixture
def http(gateway: GatewayThread) -> Iterator[httpx.Client]:
    """An httpx client on the gateway's HTTP port."""
    with httpx.Client(base_url=gateway.http, timeout=30) as client:
        yield client


def test_rest_names_with_a_percent_sign_reach_that_resource(
    http: httpx.Client, publisher: pubsub_v1.PublisherClient, project: str
) -> None:
    """'%' is legal in a Pub/Sub id (README: "ids follow Pub/Sub's rules"); a REST
    client percent-encodes it as %25. uvicorn hands the app a path already
    decoded, and the gateway unquotes it a second time, so GET
    /v1/projects/P/topics/rate%2541x looks up topic 'rateAx' (404) instead of
    'rate%41x'."""
    topic = f"projects/{project}/topics/rate%41x"
    publisher.create_topic(name=topic)
    got = http.get(f"/v1/projects/{project}/topics/rate%2541x")
    assert got.status_code == 200, got.text
    assert got.json()["name"] == topic


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


def _exactly_once_stale_ack_id(http: httpx.Client, project: str) -> tuple[str, str]:
    """An exactly-once subscription and the ack id of a delivery given back and
    delivered again (so that ack id is stale); returns (subscription, ack id)."""
    topic = f"projects/{project}/topics/orders"
    sub = f"projects/{project}/subscriptions/billing"
    assert http.put(f"/v1/{topic}", json={}).status_code == 200
    created = http.put(f"/v1/{sub}", json={"topic": topic, "enableExactlyOnceDelivery": True})
    assert created.status_code == 200, created.text
    http.post(f"/v1/{topic}:publish", json={"messages": [{"data": "YQ=="}]})
    first = http.post(f"/v1/{sub}:pull", json={"maxMessages": 1}).json()["receivedMessages"][0]
    http.post(f"/v1/{sub}:modifyAckDeadline", json={"ackIds": [first["ackId"]]})  # a nack
    again: list[dict[str, str]] = []

    def redelivered() -> bool:
        again.extend(
            http.post(f"/v1/{sub}:pull", json={"maxMessages": 1}).json().get("receivedMessages", [])
        )
        return bool(again)

    wait_for(redelivered, 20, "the redelivery")
    assert again[0]["ackId"] != first["ackId"]
    return sub, first["ackId"]


def test_rest_exactly_once_ack_failure_names_the_ack_ids(http: httpx.Client, project: str) -> None:
    """README: under exactly-once, invalid acks "fail as Pub/Sub fails them
    (INVALID_ARGUMENT with an ErrorInfo mapping each ack id to
    PERMANENT_FAILURE_INVALID_ACK_ID)". Google's REST error body carries that
    ErrorInfo in error.details; the gateway's REST body has code, message and
    status only, so a REST client cannot tell which ack ids failed."""
    sub, stale = _exactly_once_stale_ack_id(http, project)
    failed = http.post(f"/v1/{sub}:acknowledge", json={"ackIds": [stale]})
    assert failed.status_code == 400
    details = failed.json()["error"].get("details", [])
    infos = [d for d in details if d.get("@type") == "type.googleapis.com/google.rpc.ErrorInfo"]
    assert infos, failed.text
    assert infos[0]["metadata"] == {stale: "PERMANENT_FAILURE_INVALID_ACK_ID"}


def test_grpc_web_exactly_once_ack_failure_carries_status_details(
    http: httpx.Client, project: str
) -> None:
    """The same failure over gRPC-Web: the gRPC face sends the google.rpc.Status
    with its ErrorInfo as grpc-status-details-bin (which nginx's CORS config even
    exposes to browsers); the gRPC-Web face sends grpc-status and grpc-message
    only."""
    sub, stale = _exactly_once_stale_ack_id(http, project)
    request = pubsub.AcknowledgeRequest.pb()(subscription=sub, ack_ids=[stale])
    payload = request.SerializeToString()
    response = http.post(
        "/google.pubsub.v1.Subscriber/Acknowledge",
        content=_FRAME.pack(0, len(payload)) + payload,
        headers={"content-type": "application/grpc-web+proto", "x-grpc-web": "1"},
    )
    assert response.headers.get("grpc-status") == "3"
    assert b"grpc-status-details-bin" in response.content or response.headers.get(
        "grpc-status-details-bin"
    )
