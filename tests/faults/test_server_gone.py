"""Stopping with the server gone: bounded by shutdown_timeout plus SHUTDOWN_MARGIN."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

import streamsub
from streamsub.testing import RedisServer, redis_server
from tests._proxy import Proxy
from tests._wait import until

# Standalone: SIGKILLs a private redis-server, or cuts the one server off with a TCP
# proxy (a cluster's node failures: tests/cluster).
pytestmark = pytest.mark.standalone


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_stop_and_close_finish_in_bounded_time_after_the_server_is_killed(
    tmp_path: Path, redis_binary: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """With redis-server SIGKILLed while 40 handlers run and acks wait to be sent,
    leaving subscribe() and closing the client take at most shutdown_timeout plus
    SHUTDOWN_MARGIN, and the unsent acks are logged."""
    caplog.set_level(logging.WARNING, logger="streamsub")
    with redis_server(tmp_path / "redis", binary=redis_binary) as server:
        client = streamsub.connect(server.url)
        await client.__aenter__()
        await client.create_topic("doomed", partitions=4)
        await client.create_subscription("doomed-sub", topic="doomed")
        await client.publish_many(
            "doomed",
            [
                streamsub.OutgoingMessage(data=f"m{i}".encode(), ordering_key=f"k{i}")
                for i in range(80)
            ],
        )
        started: list[str] = []
        release = asyncio.Event()

        async def handler(message: streamsub.Message) -> None:
            started.append(message.message_id)
            if len(started) > 40:
                await release.wait()  # never set: these run into the shutdown timeout

        shutdown_timeout = 2.0
        sub = client.subscribe("doomed-sub", handler, shutdown_timeout=shutdown_timeout)
        await sub.start()
        await until(lambda: len(started) == 80, 5, "80 handlers started")
        server.kill()
        began = time.monotonic()
        await sub.stop()
        await client.aclose()
        took = time.monotonic() - began
    assert took <= shutdown_timeout + streamsub.SHUTDOWN_MARGIN, took
    assert any("unsent" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_closing_the_client_stops_live_subscribers_together_within_the_bound(
    tmp_path: Path, redis_binary: str | None
) -> None:
    """Two live subscribers with blocked handlers and the server SIGKILLed:
    ``aclose()`` stops them at once, within one shutdown_timeout plus the margin."""
    with redis_server(tmp_path / "redis", binary=redis_binary) as server:
        client = streamsub.connect(server.url)
        await client.__aenter__()
        started: list[str] = []
        for name in ("first", "second"):
            await client.create_topic(name, partitions=2)
            await client.create_subscription(f"{name}-sub", topic=name)
            await client.publish_many(name, [b"x"] * 10)

        async def handler(message: streamsub.Message) -> None:
            started.append(message.message_id)
            await asyncio.Event().wait()  # never returns: runs into the shutdown timeout

        for name in ("first", "second"):
            await client.subscribe(f"{name}-sub", handler, shutdown_timeout=2.0).start()
        await until(lambda: len(started) == 20, 5, "20 handlers running")
        server.kill()
        began = time.monotonic()
        await client.aclose()
        took = time.monotonic() - began
    assert took <= 2.0 + streamsub.SHUTDOWN_MARGIN, took


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_stop_on_a_dead_network_with_a_short_timeout_stays_within_the_bound(
    server: RedisServer, proxy: Proxy
) -> None:
    """Reads and a sweep stuck at a server whose connections went dead without a
    reset, shutdown_timeout 0.5 s: stop() still returns within 0.5 s plus the margin."""
    port = await proxy.start("127.0.0.1", server.port)
    async with streamsub.connect(f"redis://127.0.0.1:{port}/0", socket_timeout=30.0) as client:
        await client.create_topic("deadnet", partitions=4)
        await client.create_subscription("deadnet-sub", topic="deadnet", ack_deadline=0.4)
        await client.publish_many("deadnet", [b"x"] * 40)
        handled: list[str] = []

        async def handler(message: streamsub.Message) -> None:
            handled.append(message.message_id)

        sub = client.subscribe("deadnet-sub", handler, shutdown_timeout=0.5)
        await sub.start()
        await until(lambda: len(handled) == 40, 5, "40 handled")
        proxy.silence()
        await asyncio.sleep(0.5)  # reads and a sweep are now stuck at the dead server
        began = time.monotonic()
        await sub.stop()
        took = time.monotonic() - began
        proxy.drop()
        proxy.resume()
    assert took <= 0.5 + streamsub.SHUTDOWN_MARGIN, took
