"""A redis-server killed and restarted under running clients: they recover alone."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import streamsub
from streamsub.testing import redis_server
from tests._wait import until

# Standalone: SIGKILLs and restarts the one redis-server (a cluster's failover:
# tests/cluster/test_cluster_failover.py).
pytestmark = pytest.mark.standalone


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_publishers_and_subscribers_recover_from_a_server_restart(
    tmp_path: Path, redis_binary: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """redis-server (AOF, fsync always) is SIGKILLed and restarted mid-stream: the
    publisher's calls fail while it is down (pausing their ordering keys) and work
    again after resume_publish, the subscriber
    resumes by itself, and every message whose publish returned an id is delivered."""
    caplog.set_level(logging.WARNING, logger="streamsub")
    with redis_server(tmp_path / "redis", appendfsync="always", binary=redis_binary) as server:
        async with streamsub.connect(server.url) as client:
            await client.create_topic("restart", partitions=8)
            await client.create_subscription("restart-sub", topic="restart", ack_deadline=2.0)
            received: set[str] = set()

            async def handler(message: streamsub.Message) -> None:
                received.add(message.message_id)

            stored: list[str] = []
            failures = 0
            stop = asyncio.Event()

            async def publisher() -> None:
                nonlocal failures
                i = 0
                while not stop.is_set():
                    chunk = [
                        streamsub.OutgoingMessage(data=f"{i}-{j}".encode(), ordering_key=f"k{j}")
                        for j in range(50)
                    ]
                    i += 1
                    try:
                        stored.extend(await client.publish_many("restart", chunk))
                    except (streamsub.BackendError, streamsub.OrderingKeyPausedError):
                        failures += 1  # may or may not be stored: not counted as stored
                        # A failed publish pauses its ordering keys (as in Pub/Sub):
                        # go on with them, as a publisher that accepts the gap does.
                        for j in range(50):
                            client.resume_publish("restart", f"k{j}")
                        await asyncio.sleep(0.05)
                    else:
                        await asyncio.sleep(0.005)

            async with client.subscribe("restart-sub", handler):
                task = asyncio.create_task(publisher())
                await until(lambda: len(received) >= 2000, 20, "messages before the kill")
                server.kill()
                await asyncio.sleep(1.0)
                # However slowly a busy machine lets it notice (not within a fixed 1 s).
                await until(lambda: failures > 0, 30, "a publish to fail while the server is down")
                before_restart = failures
                server.start()
                await until(lambda: len(stored) >= 8000, 30, "publishing to resume")
                stop.set()
                await task
                await until(lambda: received >= set(stored), 30, "every stored message")
            assert before_restart > 0, "the publisher never noticed the server was down"
    assert any("retrying" in r.getMessage() for r in caplog.records), "no reconnect was logged"
