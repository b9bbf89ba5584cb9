"""Adaptive batching: a publish goes out at once while the writer is free, and
batches form only while earlier writes are in flight.

The counting and stalling backends are real backends on the test server with
``append`` wrapped; Redis itself is not imitated.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Mapping

import redis

import streamsub
from streamsub._backends.base import Link, TopicRecord
from streamsub._core.codec import encode
from streamsub._core.partition import partition_for_key
from streamsub._engine.publisher import SPLIT_AT, TopicPublisher
from streamsub._errors import StreamsubError
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND, stream_key
from tests._wait import until
from tests.conftest import ON_CLUSTER


class _Counting(TEST_BACKEND):
    """Counts its appends (writes) and the batches they came in (on a cluster a
    batch is one write per master), records how many messages each write
    stored and the most writes at the server at once; with ``hold_first``, the
    first write waits until ``release`` is set (later ones run at once)."""

    def __init__(self, url: str, *, hold_first: bool = False) -> None:
        super().__init__(url)
        self.writes = 0
        self.sizes: list[int] = []
        self.at_server = 0
        self.most_at_server = 0
        self.split = 0
        """Batches split per master (on a cluster: every batch)."""
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
        self.at_server += 1
        self.most_at_server = max(self.most_at_server, self.at_server)
        try:
            results = await super().append(topic, batch, links)
        finally:
            self.at_server -= 1
        self.sizes.append(sum(len(r) for r in results.values() if isinstance(r, list)))
        return results

    def write_groups(
        self, topic: TopicRecord, partitions: Iterable[int]
    ) -> dict[str | None, list[int]] | None:
        groups = super().write_groups(topic, partitions)
        self.split += groups is not None  # asked once a batch, as it closes
        return groups

    @property
    def batches(self) -> int:
        """Batches written: one write each on one server."""
        return self.split or self.writes


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


PARTITIONS = 16
"""Partitions of the publish_many topics below: keys spread over many streams
(and, on a cluster, over every master)."""
LARGE = streamsub.BatchSettings(max_messages=1000, max_latency=NEVER)
"""Batches of at most 1,000 messages, and a timer that never fires in a test."""


def _calls(
    caller: int, rounds: int, count: int, keys: int, keyless_every: int
) -> list[list[streamsub.OutgoingMessage]]:
    """``rounds`` publish_many calls of ``count`` messages each for ``caller``; the
    data is ``"<caller>:<index>"`` (the index counting on across its calls), the
    ordering key ``key-<index % keys>``, none for every ``keyless_every``-th
    message (0: every message has a key; 1: none has)."""
    calls = []
    for r in range(rounds):
        call = []
        for index in range(r * count, (r + 1) * count):
            keyless = keyless_every > 0 and index % keyless_every == 0
            key = None if keyless else f"key-{index % keys}"
            call.append(
                streamsub.OutgoingMessage(data=f"{caller}:{index}".encode(), ordering_key=key)
            )
        calls.append(call)
    return calls


def _published(
    ids: list[str], call: list[streamsub.OutgoingMessage]
) -> list[tuple[str, str | None, str]]:
    """What a publish_many of ``call`` returned ``ids`` for: (id, key, data) per message."""
    assert len(ids) == len(call)
    return [(i, m.ordering_key, m.data.decode()) for i, m in zip(ids, call, strict=True)]


def _assert_stored_once_in_key_order(
    redis_client: redis.Redis, topic: str, published: list[tuple[str, str | None, str]]
) -> None:
    """Every message of ``published`` is stored once, under the id its publish
    returned, each keyed one in its key's partition; read back with XRANGE per
    partition, each ordering key's messages from one caller are in index order."""
    stored: list[tuple[int, str, str | None, str]] = []
    for partition in range(PARTITIONS):
        for entry_id, fields in redis_client.xrange(stream_key(redis_client, topic, partition)):
            key = fields.get(b"k")
            stored.append(
                (
                    partition,
                    f"{partition}-{entry_id.decode()}",
                    None if key is None else key.decode(),
                    fields[b"d"].decode(),
                )
            )
    assert len({message_id for message_id, _, _ in published}) == len(published)
    assert len(stored) == len(published), f"{len(stored)} stored of {len(published)} published"
    by_id = {message_id: (key, data) for _, message_id, key, data in stored}
    assert by_id == {message_id: (key, data) for message_id, key, data in published}
    order: dict[tuple[str, str], list[int]] = {}
    for partition, _, key, data in stored:
        if key is None:
            continue
        assert partition == partition_for_key(key, PARTITIONS), f"{key} on partition {partition}"
        caller, index = data.split(":")
        order.setdefault((key, caller), []).append(int(index))
    for (key, caller), indices in order.items():
        assert indices == sorted(indices), f"{key}'s messages from caller {caller} out of order"


async def _publish_many_one_call_at_a_time(
    server: RedisServer, redis_client: redis.Redis, topic: str, keyless_every: int
) -> None:
    """Four publish_many calls of 2,500 messages (50 keys; ``keyless_every`` as
    in :func:`_calls`) made one after the other through a client whose batches
    hold 1,000 and whose timer never fires in the test: each returns, its
    messages stored once in key order, in three batches (two full, then its
    tail once they are back) or, without keys, one batch per chunk (128, 256,
    512, 1,000 and 604 messages: see ``TopicPublisher.queue_data``) or fewer (a
    chunk that comes while four writes are in flight joins the next). (A batch
    is one write, or on a cluster one per master.)"""
    redis_client.flushall()
    backend = _Counting(server.url)
    published: list[tuple[str, str | None, str]] = []
    async with streamsub.connect(backend=backend, batch_settings=LARGE) as client:
        await client.create_topic(topic, partitions=PARTITIONS)
        async with asyncio.timeout(60):
            for call in _calls(0, 4, 2500, 50, keyless_every):
                published += _published(await client.publish_many(topic, call), call)
    most = 4 * 5 if keyless_every == 1 else 4 * 3
    assert 4 * 3 <= backend.batches <= most, f"{backend.batches} batches for 4 calls of 2.5"
    _assert_stored_once_in_key_order(redis_client, topic, published)


async def test_publish_many_larger_than_a_batch_does_not_wait_for_the_timer(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A publish_many of 2,500 messages without keys (two and a half batches of
    1,000) with a max_latency of an hour returns, four times in a row: its tail
    waits behind its own first writes, not for the timer; every message is
    stored once, under the id returned for it, in three to five writes per call."""
    await _publish_many_one_call_at_a_time(server, redis_client, "large", keyless_every=1)


async def test_publish_many_with_ordering_keys_does_not_wait_for_the_timer(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A publish_many of 2,500 messages over 50 ordering keys and 16 partitions
    (added to the batch one by one) with a max_latency of an hour returns, four
    times in a row; every message is stored once, in three writes per call, and
    each key's messages are in publish order in its partition's stream."""
    await _publish_many_one_call_at_a_time(server, redis_client, "keyed", keyless_every=0)


async def test_publish_many_of_keyed_and_keyless_messages_does_not_wait_for_the_timer(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A publish_many of 2,500 messages, every third without an ordering key and
    the rest over 50 keys, with a max_latency of an hour returns, four times in
    a row; every message is stored once, in three writes per call, and each
    key's messages are in publish order."""
    await _publish_many_one_call_at_a_time(server, redis_client, "mixed", keyless_every=3)


async def test_concurrent_publish_many_callers_do_not_wait_for_the_timer(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Four tasks each making three publish_many calls of 2,450 messages (every
    third without a key, the rest over 50 keys the tasks share) at once, with a
    max_latency of an hour: every call returns (batches that form behind other
    callers' writes go when those come back, not on the timer), every message is
    stored once, and each key's messages from one caller are in publish order.
    29,400 messages are no whole number of batches of 1,000: one is left part
    full when every caller is done, with no one to fill it."""
    redis_client.flushall()
    published: list[tuple[str, str | None, str]] = []
    async with streamsub.connect(server.url, batch_settings=LARGE) as client:
        await client.create_topic("crowded", partitions=PARTITIONS)

        async def caller(c: int) -> None:
            for call in _calls(c, 3, 2450, 50, keyless_every=3):
                published.extend(_published(await client.publish_many("crowded", call), call))

        async with asyncio.timeout(60):
            await asyncio.gather(*(caller(c) for c in range(4)))
    assert len(published) == 4 * 3 * 2450
    _assert_stored_once_in_key_order(redis_client, "crowded", published)


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


async def _crowd(url: str, workers: int, each: int, keys: int) -> tuple[_Counting, int]:
    """``workers`` callers of a client, each awaiting ``each`` publishes one after
    the other (batches whose timer never fires in the test); return the backend
    and how many were published."""
    backend = _Counting(url)
    sequence = itertools.count()
    settings = streamsub.BatchSettings(max_latency=NEVER)
    async with streamsub.connect(backend=backend, batch_settings=settings) as client:
        await client.create_topic("crowd", partitions=4)

        async def worker(w: int) -> None:
            for _ in range(each):
                seq = next(sequence)  # numbered as the call is made: the key's order
                await client.publish("crowd", str(seq).encode(), ordering_key=f"key-{w % keys}")

        async with asyncio.timeout(60):
            await asyncio.gather(*(worker(w) for w in range(workers)))
    return backend, workers * each


def _stored_in_order(redis_client: redis.Redis, total: int, keys: int) -> None:
    stored: dict[str, list[int]] = {}
    for partition in range(4):
        for _, fields in redis_client.xrange(stream_key(redis_client, "crowd", partition)):
            stored.setdefault(fields[b"k"].decode(), []).append(int(fields[b"d"]))
    assert sorted(seq for seqs in stored.values() for seq in seqs) == list(range(total))
    assert len(stored) == keys
    for key, seqs in stored.items():
        assert seqs == sorted(seqs), f"{key} out of order"


async def test_a_crowd_of_callers_is_written_in_halves_two_writes_at_the_server(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """200 callers awaiting their publishes (20 ordering keys): every message is
    stored once, each key's in the order of its calls; and on one server, after
    the first round, no write carries much more than half of the crowd and two
    writes were at the server at once (one stored while the callers of the other
    publish again). Without the split every write carried the whole crowd, one
    at a time. (On a cluster a batch is one write per master, so those two
    checks would hold without the split: there only the order and the count are
    checked.)"""
    redis_client.flushall()
    workers = 200
    backend, total = await _crowd(server.url, workers, each=15, keys=20)
    _stored_in_order(redis_client, total, 20)
    if not ON_CLUSTER:
        later = backend.sizes[len(backend.sizes) // 4 :]  # the first writes find the crowd
        assert max(later) <= workers * 6 // 10, f"writes of {sorted(later)[-5:]} in a crowd of 200"
        assert backend.most_at_server >= 2, "the crowd's writes never overlapped"


async def test_a_keyed_publish_many_beside_a_crowd_is_not_cut_up(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A publish_many of 1,000 keyed messages made while 100 other callers keep
    publishing one message each: the call is one caller, not a crowd, so its
    messages are not cut into batches of half the crowd. On one server its
    messages go out in at most a few writes of hundreds (not dozens of writes
    of 50); on either, all are stored once and in key order."""
    redis_client.flushall()
    backend = _Counting(server.url)
    settings = streamsub.BatchSettings(max_latency=NEVER)
    stop = asyncio.Event()
    async with streamsub.connect(backend=backend, batch_settings=settings) as client:
        await client.create_topic("crowd", partitions=4)

        async def caller() -> None:
            while not stop.is_set():
                await client.publish("crowd", b"-1", ordering_key="crowd")

        crowd = [asyncio.create_task(caller()) for _ in range(100)]
        try:
            async with asyncio.timeout(60):
                await until(lambda: len(backend.sizes) >= 20, 30, "the crowd's writes")
                writes = len(backend.sizes)
                call = [
                    streamsub.OutgoingMessage(data=str(i).encode(), ordering_key=f"key-{i % 10}")
                    for i in range(1000)
                ]
                ids = await client.publish_many("crowd", call)
        finally:
            stop.set()
            await asyncio.gather(*crowd)
    assert len(ids) == 1000
    stored: dict[str, list[int]] = {}
    for partition in range(4):
        for _, fields in redis_client.xrange(stream_key(redis_client, "crowd", partition)):
            if fields[b"k"] != b"crowd":
                stored.setdefault(fields[b"k"].decode(), []).append(int(fields[b"d"]))
    assert sorted(i for seqs in stored.values() for i in seqs) == list(range(1000))
    for key, seqs in stored.items():
        assert seqs == sorted(seqs), f"{key} out of order"
    if not ON_CLUSTER:
        # The call's writes, beside the crowd's (half of 100 at most each).
        big = [size for size in backend.sizes[writes:] if size > 100]
        assert sum(big) >= 900, f"the call went out in writes of {backend.sizes[writes:]}"


async def test_callers_fewer_than_twice_split_at_are_not_split(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Fewer than 2 * SPLIT_AT callers at once are no crowd: their messages go out
    together, one write while the writer is free, as before (writes of about all
    of them), and in order."""
    redis_client.flushall()
    workers = 2 * SPLIT_AT - 2
    backend, total = await _crowd(server.url, workers, each=40, keys=5)
    _stored_in_order(redis_client, total, 5)
    writes = backend.sizes if not ON_CLUSTER else []
    if writes:  # one server: a write is a batch
        assert sum(writes) / len(writes) >= workers * 0.75, f"writes of {writes[:20]}"
        assert backend.most_at_server == 1
    assert len(backend.sizes) <= total // (2 if ON_CLUSTER else 10) + 2
