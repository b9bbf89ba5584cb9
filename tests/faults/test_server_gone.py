"""Stopping with the server gone: bounded by shutdown_timeout plus SHUTDOWN_MARGIN."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

import streamsub
from streamsub.testing import redis_server
from tests._wait import until


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
