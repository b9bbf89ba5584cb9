"""The nginx front door (deploy/nginx/streamsub.conf): gRPC, REST and gRPC-Web on one
TLS port, through Debian's nginx started on loopback with a certificate of its own."""

from __future__ import annotations

import base64
import inspect
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import redis
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.types import PublisherOptions
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport
from google.pubsub_v1.types import pubsub

from tests.gateway._collect import AckingCollector

from . import test_admin, test_streaming
from .conftest import GatewayThread
from .test_http import _GRPC_WEB, _frame, _frames
from .test_streaming import wait_for

CONF = Path(__file__).parents[2] / "deploy" / "nginx" / "streamsub.conf"


class FrontDoor:
    """nginx with streamsub.conf in front of a gateway; ``port`` is its TLS port."""

    def __init__(self, directory: Path, gateway: GatewayThread) -> None:
        self.certificate = directory / "streamsub.crt"
        key = directory / "streamsub.key"
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                *("-subj", "/CN=localhost", "-keyout", str(key), "-out", str(self.certificate)),
                *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
            ],
            check=True,
            capture_output=True,
        )
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        site = (
            CONF.read_text()
            .replace("listen 443 ssl http2;", f"listen 127.0.0.1:{self.port} ssl http2;")
            .replace("127.0.0.1:8085", f"127.0.0.1:{gateway.gateway.grpc_port}")
            .replace("127.0.0.1:8086", f"127.0.0.1:{gateway.gateway.http_port}")
            .replace("/etc/nginx/certs/streamsub.crt", str(self.certificate))
            .replace("/etc/nginx/certs/streamsub.key", str(key))
        )
        (directory / "streamsub.conf").write_text(site)
        temp = directory / "temp"
        temp.mkdir()
        user = "user root;\n" if os.getuid() == 0 else ""
        (directory / "nginx.conf").write_text(
            f"{user}worker_processes 1;\nerror_log {directory}/error.log warn;\n"
            f"pid {directory}/nginx.pid;\nevents {{ worker_connections 256; }}\n"
            f"http {{\n  access_log off;\n  client_body_temp_path {temp}/body;\n"
            f"  proxy_temp_path {temp}/proxy;\n  fastcgi_temp_path {temp}/fastcgi;\n"
            f"  uwsgi_temp_path {temp}/uwsgi;\n  scgi_temp_path {temp}/scgi;\n"
            f"  include {directory}/streamsub.conf;\n}}\n"
        )
        self.process = subprocess.Popen(
            [
                *("nginx", "-p", str(directory), "-c", str(directory / "nginx.conf")),
                *("-g", "daemon off;"),
            ],
            stderr=subprocess.PIPE,
        )
        self._directory = directory
        wait_for(self._listening, 10, "nginx to listen")

    def _listening(self) -> bool:
        if self.process.poll() is not None:
            log = (self._directory / "error.log").read_text()
            raise AssertionError(f"nginx exited: {self.process.stderr.read()!r} {log}")  # type: ignore[union-attr]
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def alpn(self, protocols: list[str]) -> str | None:
        context = ssl.create_default_context(cafile=str(self.certificate))
        context.set_alpn_protocols(protocols)
        with (
            socket.create_connection(("127.0.0.1", self.port)) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            return tls.selected_alpn_protocol()

    def channel(self) -> grpc.Channel:
        credentials = grpc.ssl_channel_credentials(self.certificate.read_bytes())
        return grpc.secure_channel(f"localhost:{self.port}", credentials)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="module")
def front_door(
    gateway: GatewayThread, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FrontDoor]:
    """Debian's nginx on loopback with deploy/nginx/streamsub.conf."""
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (./scripts/test installs it with apt)")
    door = FrontDoor(tmp_path_factory.mktemp("nginx"), gateway)
    yield door
    door.stop()


@pytest.fixture
def https(front_door: FrontDoor) -> Iterator[httpx.Client]:
    """httpx over TLS to the front door."""
    with httpx.Client(
        base_url=f"https://localhost:{front_door.port}",
        verify=ssl.create_default_context(cafile=str(front_door.certificate)),
        timeout=30,
    ) as client:
        yield client


def test_alpn_offers_http2_and_http11_on_one_port(front_door: FrontDoor) -> None:
    """One TLS port negotiates h2 for gRPC clients and http/1.1 for the others."""
    assert front_door.alpn(["h2", "http/1.1"]) == "h2"
    assert front_door.alpn(["http/1.1"]) == "http/1.1"


def test_official_client_over_grpc_through_nginx(front_door: FrontDoor, project: str) -> None:
    """The official client over TLS through nginx creates, publishes 1,000 messages,
    streams and acks them all, and gets NOT_FOUND as its exception class."""
    publisher = pubsub_v1.PublisherClient(
        transport=PublisherGrpcTransport(channel=front_door.channel())
    )
    subscriber = pubsub_v1.SubscriberClient(
        transport=SubscriberGrpcTransport(channel=front_door.channel())
    )
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=name, topic=topic)
    with pytest.raises(exceptions.NotFound):
        publisher.get_topic(topic=f"projects/{project}/topics/missing")
    ids = {f.result() for f in [publisher.publish(topic, b"n%d" % i) for i in range(1000)]}
    callback = AckingCollector()
    received = callback.ids

    future = subscriber.subscribe(name, callback)
    try:
        wait_for(lambda: received >= ids, 60, "every message through nginx")
    finally:
        future.cancel()
        subscriber.close()
        publisher.stop()


def test_rest_and_grpc_web_through_nginx(https: httpx.Client, project: str) -> None:
    """REST and gRPC-Web (unary and a server stream) pass nginx's content-type routing,
    with CORS headers set once by nginx and preflight answered 204."""
    topic = f"projects/{project}/topics/orders"
    sub = f"projects/{project}/subscriptions/billing"
    assert https.put(f"/v1/{topic}", json={}).status_code == 200
    missing = https.get(f"/v1/projects/{project}/topics/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["status"] == "NOT_FOUND"
    request = pubsub.Subscription
    created = https.post(
        "/google.pubsub.v1.Subscriber/CreateSubscription",
        content=_frame(request.pb()(name=sub, topic=topic).SerializeToString()),
        headers={**_GRPC_WEB, "origin": "https://app.example"},
    )
    messages, trailers = _frames(created.content)
    assert trailers["grpc-status"] == "0"
    assert pubsub.Subscription.pb().FromString(messages[0]).topic == topic
    assert created.headers.get_list("access-control-allow-origin") == ["https://app.example"]
    data = [{"data": base64.b64encode(b"w%d" % i).decode()} for i in range(100)]
    ids = set(https.post(f"/v1/{topic}:publish", json={"messages": data}).json()["messageIds"])
    assert grpc_web_stream(https, sub, ids) == ids
    preflight = https.options(
        f"/v1/{topic}",
        headers={"origin": "https://app.example", "access-control-request-method": "PUT"},
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"


@pytest.mark.parametrize(
    "flow",
    [
        test_streaming.test_nack_is_redelivered_without_delivery_attempt,
        test_streaming.test_dead_letter_policy_counts_attempts_and_moves_the_message,
        test_streaming.test_exactly_once_ack_after_the_lease_moved_fails,
        test_streaming.test_ten_thousand_messages_with_attributes_and_ordering_keys,
        test_admin.test_errors_reach_the_client_as_its_exception_classes,
    ],
    ids=["nack", "dead-letter", "exactly-once", "10000-ordered", "errors"],
)
def test_streaming_flows_through_nginx(
    flow: Callable[..., None],
    front_door: FrontDoor,
    project: str,
    redis_client: redis.Redis,
) -> None:
    """The flows of the official client — 10,000 messages with attributes and
    ordering keys, nack, dead letters, exactly-once, errors as its exception
    classes — work the same through nginx with TLS as straight to the gateway."""
    publisher = pubsub_v1.PublisherClient(
        transport=PublisherGrpcTransport(channel=front_door.channel())
    )
    ordered_publisher = pubsub_v1.PublisherClient(
        publisher_options=PublisherOptions(enable_message_ordering=True),
        transport=PublisherGrpcTransport(channel=front_door.channel()),
    )
    subscriber = pubsub_v1.SubscriberClient(
        transport=SubscriberGrpcTransport(channel=front_door.channel())
    )
    arguments: dict[str, Any] = {
        "publisher": publisher,
        "ordered_publisher": ordered_publisher,
        "subscriber": subscriber,
        "project": project,
        "redis_client": redis_client,
    }
    wanted = inspect.signature(flow).parameters
    try:
        flow(**{name: value for name, value in arguments.items() if name in wanted})
    finally:
        subscriber.close()
        publisher.stop()
        ordered_publisher.stop()


def grpc_web_stream(client: httpx.Client, sub: str, ids: set[str]) -> set[str]:
    """The ids a gRPC-Web StreamingPull of ``sub`` through ``client`` receives,
    read until they cover ``ids`` (or the stream ends)."""
    first = pubsub.StreamingPullRequest.pb()(subscription=sub, stream_ack_deadline_seconds=60)
    received: set[str] = set()
    with client.stream(
        "POST",
        "/google.pubsub.v1.Subscriber/StreamingPull",
        content=_frame(first.SerializeToString()),
        headers=_GRPC_WEB,
    ) as response:
        buffer = b""
        for chunk in response.iter_raw():
            buffer += chunk
            while len(buffer) >= 5 and len(buffer) >= 5 + int.from_bytes(buffer[1:5], "big"):
                length = int.from_bytes(buffer[1:5], "big")
                payload, buffer = buffer[5 : 5 + length], buffer[5 + length :]
                parsed = pubsub.StreamingPullResponse.pb().FromString(payload)
                received |= {m.message.message_id for m in parsed.received_messages}
            if received >= ids:
                break
    return received
