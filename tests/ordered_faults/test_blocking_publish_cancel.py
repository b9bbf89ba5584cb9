"""Cancelling the future ``streamsub.blocking.Client.publish`` returns.

Pub/Sub's publish future cannot be cancelled (``cancel()`` returns False: the
message is on its way). The blocking client's is the plain future of
``run_coroutine_threadsafe``: ``cancel()`` says yes and cancels the task that
waits for the id, but the message, already queued, is written all the same."""

from __future__ import annotations

import time

import pytest
import redis

import streamsub
import streamsub.blocking
from streamsub.testing import RedisServer
from tests._layout import pause_writes, stream_key, unpause_writes


@pytest.mark.timeout(30)
def test_a_publish_future_that_says_it_was_cancelled_was_not_published(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """While Redis holds writes (CLIENT PAUSE WRITE, 1 s), 20 publishes are made and
    their futures cancelled. Each future either refuses (cancel() False, as
    Pub/Sub's: the message is then stored) or reports cancelled, and then the
    message must not be stored: an application that publishes a "cancelled"
    message again must not get it twice (README: publish "returns a
    concurrent.futures.Future of the message id at once, as Pub/Sub's does")."""
    admin = redis_client
    admin.flushall()
    try:
        with streamsub.blocking.connect(server.url, trim_in_background=False) as client:
            client.create_topic("orders", partitions=1)
            client.publish("orders", b"warm-up").result(timeout=10)
            pause_writes(admin, 1000)
            futures = [client.publish("orders", f"m{n}".encode()) for n in range(20)]
            time.sleep(0.2)  # queued and written: the write waits at the server
            said_cancelled = {n for n, future in enumerate(futures) if future.cancel()}
            time.sleep(1.5)
        stored = {fields[b"d"] for _, fields in admin.xrange(stream_key(admin, "orders", 0))}
    finally:
        unpause_writes(admin)
    both = sorted(n for n in said_cancelled if f"m{n}".encode() in stored)
    assert not both, f"{len(both)} publishes reported cancelled were stored: m{both[:5]}..."
