"""Metrics endpoint, tracing across publish and handling, and life without the extras."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.util._once import Once
from prometheus_client.parser import text_string_to_metric_families

import streamsub
from streamsub import metrics, tracing
from streamsub.testing import RedisServer
from tests._wait import until

PARTITIONS = 4


@pytest.fixture
async def client(server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[streamsub.Client]:
    """A client on an emptied server that trims only when a test asks it to."""
    redis_client.flushall()
    async with streamsub.connect(server.url, trim_in_background=False) as connected:
        yield connected


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """An OpenTelemetry SDK recording finished spans in memory, for this module.
    After it the exporter is shut down and emptied and OpenTelemetry's global
    provider unset, as OpenTelemetry's own tests reset it (its API sets the
    provider once a process): the exporter kept every span of every later
    test in the process (2.3 million objects by the cluster tests, whose full
    garbage collections then took over a second), and later tests ran traced
    or not by whether this module ran before them."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracing.refresh()
    yield exporter
    exporter.shutdown()
    exporter.clear()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    tracing.refresh()


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_metrics_endpoint_reports_known_traffic(client: streamsub.Client) -> None:
    """A scrape of the metrics endpoint shows the messages published per topic and the
    unacknowledged messages a retention hard cap dropped."""
    metrics.reset()
    await client.create_topic(
        "orders",
        partitions=PARTITIONS,
        retention=streamsub.Retention(max_length=10, drop_unacked=True),
    )
    await client.create_topic("audit", partitions=2)
    await client.create_subscription("billing", topic="orders", start="earliest")
    for _ in range(3):
        await client.publish_many("orders", [b"o"] * 40)
    for i in range(7):
        await client.publish("audit", str(i).encode())
    result = await client.enforce_retention("orders")
    assert result.dropped_unacked > 0

    server = metrics.serve(_free_port())
    try:
        port = server.server_address[1]
        text = await asyncio.to_thread(_scrape, f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("streamsub_published_total", (("topic", "orders"),))] == 120
    assert samples[("streamsub_published_total", (("topic", "audit"),))] == 7
    assert samples[("streamsub_dropped_unacked_total", (("topic", "orders"),))] == (
        result.dropped_unacked
    )


async def test_metrics_endpoint_reports_a_subscribers_known_traffic(
    client: streamsub.Client,
) -> None:
    """Known traffic through a subscriber: 60 messages on 4 partitions, three
    dead-lettered, nine nacked once and then acked: a scrape shows delivered,
    redelivered, acked, nacked, dead-lettered and both latency counts exactly."""
    metrics.reset()
    await client.create_topic("jobs", partitions=PARTITIONS)
    await client.create_topic("jobs-dead", partitions=1)
    await client.create_subscription(
        "workers",
        topic="jobs",
        dead_letter_topic="jobs-dead",
        max_delivery_attempts=5,
        retry_policy=streamsub.RetryPolicy(minimum_backoff=0.1, maximum_backoff=0.1),
    )
    await client.publish_many("jobs", [str(i).encode() for i in range(60)])

    def handle(message: streamsub.Message) -> None:
        n = int(message.data)
        if n % 20 == 0:
            message.dead_letter("bad input")
        elif n % 6 == 0 and message.delivery_attempt == 1:
            message.nack()
        else:
            message.ack()

    async with client.subscribe("workers", handle, ack_mode="manual") as sub:
        await until(
            lambda: sub.statistics().acked == 57 and sub.statistics().dead_lettered == 3,
            10,
            "57 acked and 3 dead-lettered",
        )
    server = metrics.serve(_free_port())
    try:
        port = server.server_address[1]
        text = await asyncio.to_thread(_scrape, f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    label = (("subscription", "workers"),)
    nacked = len([n for n in range(60) if n % 6 == 0 and n % 20])  # 9
    assert samples[("streamsub_delivered_total", label)] == 60 + nacked
    assert samples[("streamsub_redelivered_total", label)] == nacked
    assert samples[("streamsub_acked_total", label)] == 57
    assert samples[("streamsub_nacked_total", label)] == nacked
    assert samples[("streamsub_dead_lettered_total", label)] == 3
    assert samples[("streamsub_handler_seconds_count", label)] == 60 + nacked
    assert samples[("streamsub_end_to_end_seconds_count", label)] == 57


async def test_a_trace_spans_publish_and_handling(
    client: streamsub.Client, spans: InMemorySpanExporter
) -> None:
    """Each handled message's CONSUMER span is the child of the PRODUCER span that
    published it, in the same trace, on every partition."""
    assert tracing.ENABLED
    spans.clear()
    await client.create_topic("orders", partitions=PARTITIONS)
    await client.create_subscription("billing", topic="orders")
    ids = [await client.publish("orders", str(i).encode(), ordering_key=f"k{i}") for i in range(12)]
    ids += await client.publish_many("orders", [b"batch"] * 8)
    assert {i.split("-")[0] for i in ids} == {str(p) for p in range(PARTITIONS)}
    seen: dict[str, dict[str, str]] = {}

    async def handle(message: streamsub.Message) -> None:
        seen[message.message_id] = dict(message.attributes)

    async with client.subscribe("billing", handle):  # the subscriber traces handling
        await until(lambda: len(seen) == len(ids), 30, "every message handled")

    finished = spans.get_finished_spans()
    producers = {s.context.span_id: s for s in finished if s.kind == SpanKind.PRODUCER}
    consumers = [s for s in finished if s.kind == SpanKind.CONSUMER]
    assert len(producers) == 13  # 12 publishes and one publish_many
    assert len(consumers) == len(ids)
    for span in consumers:
        assert span.parent is not None
        producer = producers[span.parent.span_id]
        assert producer.context.trace_id == span.context.trace_id
        assert producer.name == "orders publish"
        assert span.name == "billing process"
    assert all(tracing.TRACEPARENT in attributes for attributes in seen.values())
    message_ids = {span.attributes["messaging.message.id"] for span in consumers if span.attributes}
    assert message_ids == set(ids)


def test_streamsub_works_without_the_extras(server: RedisServer) -> None:
    """Without prometheus-client and opentelemetry, streamsub imports, publishes and
    counts; only exporting metrics raises, saying what to install."""
    program = f"""
import asyncio, importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("opentelemetry", "prometheus_client"):
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, Block())
import streamsub
from streamsub import metrics, tracing
assert not tracing.ENABLED

async def main():
    async with streamsub.connect({server.url!r}, trim_in_background=False) as client:
        await client.create_topic("no-extras", partitions=2)
        await client.publish("no-extras", b"x", attributes={{"a": "b"}})
        await client.delete_topic("no-extras")

asyncio.run(main())
assert metrics.snapshot()["published"] == {{"no-extras": 1}}
try:
    metrics.serve(0)
except streamsub.FailedPreconditionError as exc:
    assert "streamsub[metrics]" in str(exc)
else:
    raise AssertionError("serve() worked without prometheus-client")
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


async def test_a_span_covers_the_whole_handling_of_an_async_callable_object(
    client: streamsub.Client, spans: InMemorySpanExporter
) -> None:
    """An object with ``async def __call__`` as handler: its span is current inside
    the handler and lasts as long as the handling (0.2 s), for each of 8 messages."""
    spans.clear()
    await client.create_topic("objects", partitions=2)
    await client.create_subscription("objects-sub", topic="objects")
    ids = await client.publish_many("objects", [str(i).encode() for i in range(8)])

    class Handler:
        def __init__(self) -> None:
            self.current: list[bool] = []

        async def __call__(self, message: streamsub.Message) -> None:
            self.current.append(trace.get_current_span().is_recording())
            await asyncio.sleep(0.2)

    handler = Handler()
    async with client.subscribe("objects-sub", handler) as sub:
        await until(lambda: sub.statistics().acked == 8, 10, "8 acked")
    consumers = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CONSUMER]
    assert len(consumers) == len(ids)
    assert handler.current == [True] * 8
    for span in consumers:
        assert span.end_time is not None
        assert span.start_time is not None
        assert (span.end_time - span.start_time) / 1e9 >= 0.19


async def test_the_in_flight_gauge_counts_what_subscribers_hold(client: streamsub.Client) -> None:
    """Two running subscribers of one subscription holding 30 messages between them:
    the gauge says 30 while they hold them, and 0 once all are acked."""
    metrics.reset()
    await client.create_topic("gauge", partitions=PARTITIONS)
    await client.create_subscription("gauge-sub", topic="gauge")
    await client.publish_many("gauge", [str(i).encode() for i in range(30)])
    release = asyncio.Event()
    started = 0

    async def handler(message: streamsub.Message) -> None:
        nonlocal started
        started += 1
        await release.wait()

    key = ("streamsub_in_flight_messages", (("subscription", "gauge-sub"),))

    def gauge() -> float:
        text = metrics.registry()
        from prometheus_client import generate_latest

        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(text).decode())
            for s in family.samples
        }
        return samples.get(key, 0.0)

    async with (
        client.subscribe("gauge-sub", handler, consumer="one") as one,
        client.subscribe("gauge-sub", handler, consumer="two") as two,
    ):
        try:
            await until(lambda: started == 30, 10, "30 handlers running")
            held = gauge()
        finally:
            release.set()
        assert held == 30
        await until(lambda: one.statistics().acked + two.statistics().acked == 30, 10, "30 acked")
        assert gauge() == 0
