"""REST (Pub/Sub's v1 HTTP mapping) and gRPC-Web on the gateway's HTTP port, with httpx."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1.types import pubsub

from .conftest import GatewayThread
from .test_streaming import wait_for

_FRAME = struct.Struct(">BI")


@pytest.fixture
def http(gateway: GatewayThread) -> Iterator[httpx.Client]:
    """An httpx client on the gateway's HTTP port."""
    with httpx.Client(base_url=gateway.http, timeout=30) as client:
        yield client


def test_rest_publish_pull_acknowledge(http: httpx.Client, project: str) -> None:
    """Topics and subscriptions are made with PUT, 500 messages published with base64
    data and attributes are pulled across partitions, and acked ones do not return."""
    topic = f"projects/{project}/topics/orders"
    sub = f"projects/{project}/subscriptions/billing"
    created = http.put(f"/v1/{topic}", json={"labels": {"team": "a"}})
    assert created.status_code == 200, created.text
    assert created.json() == {"name": topic, "labels": {"team": "a"}}
    made = http.put(f"/v1/{sub}", json={"topic": topic, "ackDeadlineSeconds": 20})
    assert made.json()["ackDeadlineSeconds"] == 20
    messages = [
        {"data": base64.b64encode(b"payload %d" % i).decode(), "attributes": {"i": str(i)}}
        for i in range(500)
    ]
    published = http.post(f"/v1/{topic}:publish", json={"messages": messages})
    ids = published.json()["messageIds"]
    assert len(set(ids)) == 500
    received: dict[str, dict[str, Any]] = {}
    while len(received) < 500:
        pulled = http.post(f"/v1/{sub}:pull", json={"maxMessages": 100}).json()
        batch = pulled.get("receivedMessages", [])
        assert batch, f"nothing more after {len(received)} messages"
        assert len(batch) <= 100
        for item in batch:
            received[item["message"]["messageId"]] = item
        acked = http.post(f"/v1/{sub}:acknowledge", json={"ackIds": [m["ackId"] for m in batch]})
        assert acked.json() == {}
    assert set(received) == set(ids)
    for item in received.values():
        i = int(item["message"]["attributes"]["i"])
        assert base64.b64decode(item["message"]["data"]) == b"payload %d" % i
        assert "publishTime" in item["message"]
    assert http.post(f"/v1/{sub}:pull", json={"maxMessages": 10}).json() == {}
    listed = http.get(f"/v1/projects/{project}/topics").json()
    assert [t["name"] for t in listed["topics"]] == [topic]
    assert http.get(f"/v1/{topic}/subscriptions").json() == {"subscriptions": [sub]}
    patched = http.patch(
        f"/v1/{sub}",
        json={"subscription": {"ackDeadlineSeconds": 30}, "updateMask": "ackDeadlineSeconds"},
    )
    assert patched.json()["ackDeadlineSeconds"] == 30
    assert http.delete(f"/v1/{sub}").json() == {}
    assert http.delete(f"/v1/{topic}").json() == {}


def test_rest_nack_by_modify_ack_deadline(http: httpx.Client, project: str) -> None:
    """modifyAckDeadline 0 gives a pulled message back, and it is pulled again."""
    topic = f"projects/{project}/topics/orders"
    sub = f"projects/{project}/subscriptions/billing"
    http.put(f"/v1/{topic}", json={})
    http.put(f"/v1/{sub}", json={"topic": topic})
    http.post(f"/v1/{topic}:publish", json={"messages": [{"data": "YQ=="}]})
    first = http.post(f"/v1/{sub}:pull", json={"maxMessages": 1}).json()["receivedMessages"]
    nacked = http.post(
        f"/v1/{sub}:modifyAckDeadline",
        json={"ackIds": [first[0]["ackId"]], "ackDeadlineSeconds": 0},
    )
    assert nacked.status_code == 200
    again: list[Any] = []

    def pulled() -> bool:
        again.extend(
            http.post(f"/v1/{sub}:pull", json={"maxMessages": 1}).json().get("receivedMessages", [])
        )
        return bool(again)

    wait_for(pulled, 30, "the redelivery")
    assert again[0]["message"]["messageId"] == first[0]["message"]["messageId"]
    assert again[0]["ackId"] != first[0]["ackId"]


def test_rest_errors_are_googles_json(http: httpx.Client, project: str) -> None:
    """Errors come as {"error": {"code", "message", "status"}} with the HTTP status."""
    topic = f"projects/{project}/topics/orders"
    missing = http.get(f"/v1/{topic}")
    assert missing.status_code == 404
    assert missing.json()["error"]["status"] == "NOT_FOUND"
    assert missing.json()["error"]["code"] == 404
    assert topic in missing.json()["error"]["message"]
    http.put(f"/v1/{topic}", json={})
    twice = http.put(f"/v1/{topic}", json={})
    assert twice.status_code == 409
    assert twice.json()["error"]["status"] == "ALREADY_EXISTS"
    bad = http.put(f"/v1/projects/{project}/topics/goog-x", json={})
    assert bad.status_code == 400
    assert bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    garbage = http.post(f"/v1/{topic}:publish", content=b"{not json")
    assert garbage.status_code == 400
    assert http.get("/v2/nothing").status_code == 404
    push = http.post(f"/v1/projects/{project}/subscriptions/billing:modifyPushConfig", json={})
    assert push.status_code == 501
    assert push.json()["error"]["status"] == "UNIMPLEMENTED"


def test_rest_seek_and_snapshots(http: httpx.Client, project: str) -> None:
    """Snapshots are made with PUT, read, listed (per project and per topic), patched
    only as streamsub keeps them and deleted; :seek to the snapshot and to a time
    deliver the acked messages again."""
    topic = f"projects/{project}/topics/orders"
    sub = f"projects/{project}/subscriptions/billing"
    snapshot = f"projects/{project}/snapshots/nightly"
    http.put(f"/v1/{topic}", json={})
    http.put(f"/v1/{sub}", json={"topic": topic})
    made = http.put(f"/v1/{snapshot}", json={"subscription": sub})
    assert made.status_code == 200, made.text
    assert made.json()["name"] == snapshot
    assert made.json()["topic"] == topic
    assert "expireTime" in made.json()
    assert http.get(f"/v1/{snapshot}").json() == made.json()
    assert http.get(f"/v1/projects/{project}/snapshots").json() == {"snapshots": [made.json()]}
    assert http.get(f"/v1/{topic}/snapshots").json() == {"snapshots": [snapshot]}
    again = http.put(f"/v1/{snapshot}", json={"subscription": sub})
    assert again.status_code == 409
    refused = http.patch(
        f"/v1/{snapshot}", json={"snapshot": {"labels": {"a": "b"}}, "updateMask": "labels"}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["status"] == "INVALID_ARGUMENT"
    data = [{"data": base64.b64encode(b"m%d" % i).decode()} for i in range(100)]
    ids = set(http.post(f"/v1/{topic}:publish", json={"messages": data}).json()["messageIds"])

    def pull_all() -> set[str]:
        got: set[str] = set()
        for _ in range(50):
            batch = http.post(f"/v1/{sub}:pull", json={"maxMessages": 100}).json()
            items = batch.get("receivedMessages", [])
            got |= {m["message"]["messageId"] for m in items}
            if items:
                http.post(f"/v1/{sub}:acknowledge", json={"ackIds": [m["ackId"] for m in items]})
            if got >= ids:
                break
        return got

    assert pull_all() == ids
    sought = http.post(f"/v1/{sub}:seek", json={"snapshot": snapshot})
    assert sought.status_code == 200, sought.text
    assert sought.json() == {}
    assert pull_all() == ids  # the snapshot was taken before they were published
    sought = http.post(f"/v1/{sub}:seek", json={"time": "2000-01-01T00:00:00Z"})
    assert sought.json() == {}
    assert pull_all() == ids
    missing = http.post(
        f"/v1/{sub}:seek", json={"snapshot": f"projects/{project}/snapshots/nothing"}
    )
    assert missing.status_code == 404
    assert http.delete(f"/v1/{snapshot}").json() == {}
    assert http.get(f"/v1/{snapshot}").status_code == 404


def _frame(payload: bytes) -> bytes:
    return _FRAME.pack(0, len(payload)) + payload


def _frames(body: bytes) -> tuple[list[bytes], dict[str, str]]:
    messages, trailers, pos = [], {}, 0
    while pos < len(body):
        flag, length = _FRAME.unpack_from(body, pos)
        payload = body[pos + _FRAME.size : pos + _FRAME.size + length]
        pos += _FRAME.size + length
        if flag & 0x80:
            for line in payload.decode().split("\r\n"):
                if line:
                    key, _, value = line.partition(":")
                    trailers[key.strip()] = value.strip()
        else:
            messages.append(payload)
    return messages, trailers


_GRPC_WEB = {"content-type": "application/grpc-web+proto", "x-grpc-web": "1"}


def test_grpc_web_unary_calls_and_cors(http: httpx.Client, project: str) -> None:
    """gRPC-Web unary calls answer with a message and an OK trailer, errors with
    grpc-status in the trailer, and CORS preflight is answered 204."""
    topic = f"projects/{project}/topics/orders"
    request = pubsub.Topic.pb()(name=topic)
    response = http.post(
        "/google.pubsub.v1.Publisher/CreateTopic",
        content=_frame(request.SerializeToString()),
        headers={**_GRPC_WEB, "origin": "https://app.example"},
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://app.example"
    assert "grpc-status" in response.headers["access-control-expose-headers"]
    messages, trailers = _frames(response.content)
    assert pubsub.Topic.pb().FromString(messages[0]).name == topic
    assert trailers["grpc-status"] == "0"
    again = http.post(
        "/google.pubsub.v1.Publisher/CreateTopic",
        content=_frame(request.SerializeToString()),
        headers=_GRPC_WEB,
    )
    assert again.headers["grpc-status"] == "6"  # ALREADY_EXISTS
    assert _frames(again.content)[1]["grpc-status"] == "6"
    preflight = http.options(
        "/google.pubsub.v1.Publisher/CreateTopic",
        headers={
            "origin": "https://app.example",
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type,x-grpc-web",
        },
    )
    assert preflight.status_code == 204
    assert "x-grpc-web" in preflight.headers["access-control-allow-headers"]


def test_grpc_web_server_stream_delivers_messages(
    http: httpx.Client, gateway: GatewayThread, project: str
) -> None:
    """A StreamingPull opened over gRPC-Web with one request streams 200 messages,
    which unary gRPC-Web Acknowledge calls settle."""
    topic = f"projects/{project}/topics/orders"
    sub = f"projects/{project}/subscriptions/billing"
    http.put(f"/v1/{topic}", json={})
    http.put(f"/v1/{sub}", json={"topic": topic})
    messages = [{"data": base64.b64encode(b"m%d" % i).decode()} for i in range(200)]
    ids = set(http.post(f"/v1/{topic}:publish", json={"messages": messages}).json()["messageIds"])
    first = pubsub.StreamingPullRequest.pb()(
        subscription=sub, stream_ack_deadline_seconds=60, max_outstanding_messages=1000
    )
    received: dict[str, str] = {}
    with (
        httpx.Client(base_url=gateway.http, timeout=30) as streaming,
        streaming.stream(
            "POST",
            "/google.pubsub.v1.Subscriber/StreamingPull",
            content=_frame(first.SerializeToString()),
            headers=_GRPC_WEB,
        ) as response,
    ):
        assert response.status_code == 200
        buffer = b""
        for chunk in response.iter_raw():
            buffer += chunk
            while len(buffer) >= _FRAME.size:
                flag, length = _FRAME.unpack_from(buffer, 0)
                if len(buffer) < _FRAME.size + length:
                    break
                payload = buffer[_FRAME.size : _FRAME.size + length]
                buffer = buffer[_FRAME.size + length :]
                assert not flag & 0x80, payload
                parsed = pubsub.StreamingPullResponse.pb().FromString(payload)
                for item in parsed.received_messages:
                    received[item.message.message_id] = item.ack_id
            if len(received) >= 200:
                break
    assert set(received) == ids
    ack = pubsub.AcknowledgeRequest.pb()(subscription=sub, ack_ids=list(received.values()))
    acked = http.post(
        "/google.pubsub.v1.Subscriber/Acknowledge",
        content=_frame(ack.SerializeToString()),
        headers=_GRPC_WEB,
    )
    assert _frames(acked.content)[1]["grpc-status"] == "0"
    assert http.post(f"/v1/{sub}:pull", json={"maxMessages": 10}).json() == {}


def test_grpc_web_text_mode_unary_and_stream(http: httpx.Client, project: str) -> None:
    """The base64 grpc-web-text form browsers use by default carries a unary call and
    a server stream, each response chunk base64 on its own."""
    text = {"content-type": "application/grpc-web-text", "x-grpc-web": "1"}
    topic = f"projects/{project}/topics/orders"
    sub = f"projects/{project}/subscriptions/billing"
    created = http.post(
        "/google.pubsub.v1.Publisher/CreateTopic",
        content=base64.b64encode(_frame(pubsub.Topic.pb()(name=topic).SerializeToString())),
        headers=text,
    )
    assert created.headers["content-type"] == "application/grpc-web-text"
    messages, trailers = _frames(base64.b64decode(created.content))
    assert pubsub.Topic.pb().FromString(messages[0]).name == topic
    assert trailers["grpc-status"] == "0"
    http.put(f"/v1/{sub}", json={"topic": topic})
    data = [{"data": base64.b64encode(b"t%d" % i).decode()} for i in range(50)]
    ids = set(http.post(f"/v1/{topic}:publish", json={"messages": data}).json()["messageIds"])
    first = pubsub.StreamingPullRequest.pb()(subscription=sub, stream_ack_deadline_seconds=60)
    received: set[str] = set()
    with http.stream(
        "POST",
        "/google.pubsub.v1.Subscriber/StreamingPull",
        content=base64.b64encode(_frame(first.SerializeToString())),
        headers=text,
    ) as response:
        pending, frames = b"", b""
        for chunk in response.iter_raw():
            pending += chunk
            # Decode whole groups of four characters, as the browser client does.
            usable = len(pending) - len(pending) % 4
            decoded, pending = pending[:usable], pending[usable:]
            frames += b"".join(
                base64.b64decode(decoded[i : i + 4]) for i in range(0, len(decoded), 4)
            )
            while len(frames) >= _FRAME.size:
                _, length = _FRAME.unpack_from(frames, 0)
                if len(frames) < _FRAME.size + length:
                    break
                payload = frames[_FRAME.size : _FRAME.size + length]
                frames = frames[_FRAME.size + length :]
                parsed = pubsub.StreamingPullResponse.pb().FromString(payload)
                received |= {m.message.message_id for m in parsed.received_messages}
            if received >= ids:
                break
    assert received == ids


def test_rest_exactly_once_ack_failure_names_the_ack_ids(http: httpx.Client, project: str) -> None:
    """README: under exactly-once, invalid acks "fail as Pub/Sub fails them
    (INVALID_ARGUMENT with an ErrorInfo mapping each ack id to
    PERMANENT_FAILURE_INVALID_ACK_ID)". Google's REST error body carries that
    ErrorInfo in error.details; the gateway's REST body used to have code, message
    and status only, so a REST client could not tell which ack ids failed."""
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


def test_rest_names_with_a_percent_sign_reach_that_resource(
    http: httpx.Client, publisher: pubsub_v1.PublisherClient, project: str
) -> None:
    """'%' is legal in a Pub/Sub id (README: "ids follow Pub/Sub's rules"); a REST
    client percent-encodes it as %25. uvicorn hands the app a path already
    decoded, and the gateway used to unquote it a second time: GET
    /v1/projects/P/topics/rate%2541x looked up topic 'rateAx' (404) instead of
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
    is a broken request and must fail (non-zero grpc-status). The gateway used to slice
    what there was, parse it, and run the call: OK, and the topic exists."""
    name = f"projects/{project}/topics/framed"
    payload = pubsub.Topic.pb()(name=name).SerializeToString()
    response = http.post(
        "/google.pubsub.v1.Publisher/CreateTopic",
        content=_FRAME.pack(0, len(payload) + 100) + payload,
        headers={"content-type": "application/grpc-web+proto", "x-grpc-web": "1"},
    )
    assert b"grpc-status:0\r\n" not in response.content
    assert response.headers.get("grpc-status") not in (None, "0")
