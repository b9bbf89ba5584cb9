"""Fixtures of the gateway tests: a real gateway on loopback, the official client.

The official ``google-cloud-pubsub`` client is synchronous (it runs its own
threads), so the in-process gateway runs on an event loop in a thread of its
own and the tests are plain functions. Each test works in a project of its own.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.types import PublisherOptions

from streamsub.gateway import Gateway
from streamsub.testing import RedisServer


class GatewayThread:
    """A Gateway serving from its own event loop in a daemon thread."""

    def __init__(self, url: str, **options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.gateway = Gateway(
            url, grpc_address="127.0.0.1:0", http_address="127.0.0.1:0", **options
        )
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.call(self.gateway.start())

    def call(self, coroutine: Any, timeout: float = 30.0) -> Any:
        """Run ``coroutine`` on the gateway's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.gateway.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.gateway.http_port}"

    def stop(self) -> None:
        self.call(self.gateway.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="session")
def gateway(server: RedisServer) -> Iterator[GatewayThread]:
    """One gateway on the session's Redis (tests keep apart by project)."""
    running = GatewayThread(server.url, stream_lifetime=1800.0)
    yield running
    running.stop()


@pytest.fixture
def project() -> str:
    """A project id of this test's own."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def emulator(gateway: GatewayThread, monkeypatch: pytest.MonkeyPatch) -> str:
    """PUBSUB_EMULATOR_HOST pointed at the gateway; returns the host."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", gateway.host)
    return gateway.host


@pytest.fixture
def publisher(emulator: str) -> Iterator[pubsub_v1.PublisherClient]:
    """The official publisher client, through the gateway."""
    client = pubsub_v1.PublisherClient()
    yield client
    client.stop()


@pytest.fixture
def ordered_publisher(emulator: str) -> Iterator[pubsub_v1.PublisherClient]:
    """The official publisher client with message ordering, through the gateway."""
    client = pubsub_v1.PublisherClient(
        publisher_options=PublisherOptions(enable_message_ordering=True)
    )
    yield client
    client.stop()


@pytest.fixture
def subscriber(emulator: str) -> Iterator[pubsub_v1.SubscriberClient]:
    """The official subscriber client, through the gateway."""
    client = pubsub_v1.SubscriberClient()
    yield client
    client.close()
