"""`streamsub gateway --metrics-port`: the library's metrics and the gateway's own."""

from __future__ import annotations

import httpx
import pytest
from google.cloud import pubsub_v1

from streamsub.testing import RedisServer
from tests.gateway._collect import AckingCollector

from .test_restart import GatewayProcess, _free_port
from .test_streaming import wait_for

pytestmark = pytest.mark.timeout(120)


def _sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_gateway_serves_deliveries_acks_and_streams_as_metrics(
    server: RedisServer, project: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway started with --metrics-port logs where, and its /metrics counts the
    messages its streams delivered and the acks it settled per subscription, the
    messages it holds, and its open and opened streams."""
    port, metrics_port = _free_port(), _free_port()
    gateway = GatewayProcess(server.url, port, "--metrics-port", str(metrics_port))
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{port}")
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    native = f"{project}~billing"
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=name, topic=topic)
    callback = AckingCollector()
    received = callback.ids

    future = subscriber.subscribe(name, callback)
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        assert any(f":{metrics_port}/metrics" in line for line in gateway.lines)
        ids = {f.result() for f in [publisher.publish(topic, b"m%d" % i) for i in range(50)]}
        wait_for(lambda: received == ids, 30, "every message")
        label = f'{{subscription="{native}"}}'

        def counted() -> bool:
            text = httpx.get(url).text
            return _sample(text, f"streamsub_acked_total{label}") == 50

        wait_for(counted, 30, "50 acks in the metrics")
        text = httpx.get(url).text
        assert _sample(text, f"streamsub_delivered_total{label}") == 50
        assert _sample(text, f"streamsub_in_flight_messages{label}") == 0
        assert _sample(text, f'streamsub_published_total{{topic="{project}~orders"}}') == 50
        assert _sample(text, "streamsub_gateway_streams_open") == 1
        assert (_sample(text, "streamsub_gateway_streams_opened_total") or 0) >= 1
    finally:
        future.cancel()
        subscriber.close()
        publisher.stop()
        assert gateway.terminate() == 0
