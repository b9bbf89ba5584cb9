"""Adaptive batching: a publish goes out at once while the writer is free, and
batches form only while earlier writes are in flight.

The counting and stalling backends are real backends on the test server with
``append`` wrapped; Redis itself is not imitated.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping

import redis

import streamsub
from streamsub._backends.base import Link, TopicRecord
from streamsub._core.codec import encode
from streamsub._core.partition import partition_for_key
from streamsub._engine.publisher import TopicPublisher
from streamsub._errors import StreamsubError
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND, stream_key
from tests._wait import until


class _Counting(TEST_BACKEND):
    """Counts its appends (writes); with ``hold_first``, the first one waits
    until ``release`` is set (later ones run at once)."""

    def __init__(self, url: str, *, hold_first: bool = False) -> None:
        super().__init__(url)
        self.writes = 0
        self.release = asyncio.Event()
        if not hold_first:
            self.release.set()

    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        self.writes += 1
        if self.writes == 1:
            await self.release.wait()
        return await super().append(topic, batch, links)


# A ceiling no test waits out: a publish that waited for the timer would run
# into the test's timeout, however slow or busy the machine.
NEVER = 3600.0


def _frozen() -> float:
    """A clock that never moves: a batch can then close only because the writer
    is free (or full), never because its max_latency has passed."""
    return 0.0


async def test_a_lone_publish_does_not_wait_for_the_batch_timer(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With nothing in flight, each publish is written at once: 20 sequential
    publishes through a client whose max_latency is an hour all return (one wait
    for the timer would outlast the test's timeout), and 200 with the default
    settings return from a publisher whose clock never moves, so no batch of
    theirs could have closed on the timer."""
    redis_client.flushall()
    slow = streamsub.BatchSettings(max_latency=NEVER)
    async with streamsub.connect(server.url, batch_settings=slow) as client:
        await client.create_topic("lone", partitions=4)
        async with asyncio.timeout(60):
            for i in range(20):
                await client.publish("lone", f"m{i}".encode(), ordering_key=f"key-{i % 3}")
    assert streamsub.BatchSettings().max_latency == 0.005
    backend = TEST_BACKEND(server.url)
    try:
        topic = await backend.get_topic("lone")
        assert topic is not None
        publisher = TopicPublisher(backend, topic, streamsub.BatchSettings(), clock=_frozen)
        async with asyncio.timeout(60):
            for i in range(200):
                await publisher.publish([encode(f"d{i}".encode(), f"key-{i % 3}", max_bytes=1024)])
        await publisher.aclose()
    finally:
        await backend.close()
    stored = sum(redis_client.xlen(stream_key(redis_client, "lone", p)) for p in range(4))
    assert stored == 220


async def test_publish_many_smaller_than_a_batch_does_not_wait_for_the_timer(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A publish_many of 500 (half a batch) with a max_latency of an hour returns
    without waiting for the timer, ten times in a row (one wait would outlast the
    test's timeout)."""
    redis_client.flushall()
    slow = streamsub.BatchSettings(max_latency=NEVER)
    async with streamsub.connect(server.url, batch_settings=slow) as client:
        await client.create_topic("many", partitions=4)
        async with asyncio.timeout(60):
            for c in range(10):
                await client.publish_many("many", [f"{c}:{i}".encode() for i in range(500)])
    stored = sum(redis_client.xlen(stream_key(redis_client, "many", p)) for p in range(4))
    assert stored == 5000


async def test_concurrent_publishers_form_batches_and_keep_key_order(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """200 concurrent publishers over 4 partitions and 10 ordering keys, each
    awaiting its publishes one by one with max_latency=1.0: messages of a key are
    stored in the order their publish calls were made, far fewer writes than
    messages happen (batches form while writes are in flight), and no batch waits
    for the timer: the publisher's clock never moves, so a batch that needed it
    would never be written."""
    redis_client.flushall()
    backend = _Counting(server.url)
    settings = streamsub.BatchSettings(max_latency=1.0)
    workers, each, keys = 200, 10, 10
    sequence = itertools.count()
    try:
        topic = await backend.create_topic(TopicRecord("crowd", 4, "", 0.0))
        publisher = TopicPublisher(backend, topic, settings, clock=_frozen)

        async def worker(w: int) -> None:
            for _ in range(each):
                # Numbered as the call is made: the calls' order is the key's order.
                seq = next(sequence)
                message = encode(str(seq).encode(), f"key-{w % keys}", max_bytes=2**20)
                await publisher.publish([message])

        async with asyncio.timeout(60):
            await asyncio.gather(*(worker(w) for w in range(workers)))
        await publisher.aclose()
    finally:
        await backend.close()

    total = workers * each
    stored: dict[str, list[int]] = {}
    for partition in range(4):
        for _, fields in redis_client.xrange(stream_key(redis_client, "crowd", partition)):
            stored.setdefault(fields[b"k"].decode(), []).append(int(fields[b"d"]))
    assert sum(len(seqs) for seqs in stored.values()) == total
    assert len(stored) == keys
    for key, seqs in stored.items():
        assert seqs == sorted(seqs), f"{key} out of order"
    assert backend.writes <= total // 20, f"{backend.writes} writes for {total} messages"


async def test_while_a_write_is_in_flight_the_batch_goes_at_its_latency_ceiling(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A publish made while an earlier write is stuck in flight is still written
    once max_latency has passed (the timer is a ceiling): its write starts, and
    its publish completes, while the first write is still held."""
    redis_client.flushall()
    backend = _Counting(server.url, hold_first=True)
    settings = streamsub.BatchSettings(max_latency=0.05)
    try:
        topic = await backend.create_topic(TopicRecord("ceiling", 2, "", 0.0))
        publisher = TopicPublisher(backend, topic, settings)
        # Keys on different partitions: the held write was never sent, so a write
        # linked after it would (rightly) be refused.
        assert partition_for_key("k1", 2) != partition_for_key("k2", 2)
        first = asyncio.ensure_future(publisher.publish([encode(b"a", "k1", max_bytes=1024)]))
        await until(lambda: backend.writes == 1, 5, "the first write in flight")
        second = asyncio.ensure_future(publisher.publish([encode(b"b", "k2", max_bytes=1024)]))
        async with asyncio.timeout(5):
            ids = await second
        assert len(ids) == 1
        assert not first.done(), "the first write was not held"
        backend.release.set()
        async with asyncio.timeout(5):
            await first
        await publisher.aclose()
    finally:
        await backend.close()
