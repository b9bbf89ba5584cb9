"""publish_many of messages without ordering keys joins batches in runs: the
batch limits, the ids and the stored messages are as if added one by one.

The recording backend is a real backend on the test server with ``append``
wrapped; Redis itself is not imitated.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Mapping

import redis

import streamsub
from streamsub import OutgoingMessage, metrics
from streamsub._backends.base import Link, TopicRecord
from streamsub._core.codec import decode, encode, unpack_fields
from streamsub._engine.publisher import TopicPublisher, _Lane, _Token
from streamsub._errors import StreamsubError
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND, stream_key


class _Recording(TEST_BACKEND):
    """Records, per write, each partition's messages as (data, ordering key)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.writes: list[dict[int, list[tuple[bytes, bytes | None]]]] = []

    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        write: dict[int, list[tuple[bytes, bytes | None]]] = {}
        for partition, packed in batch.items():
            fields = unpack_fields(packed)
            messages = write[partition] = []
            # Every message here is data (d) and maybe a key (k): split at each "d".
            for i in range(0, len(fields), 2):
                if fields[i] == b"d":
                    messages.append((fields[i + 1], None))
                elif fields[i] == b"k":
                    messages[-1] = (messages[-1][0], fields[i + 1])
        self.writes.append(write)
        return await super().append(topic, batch, links)


def _stored(redis_client: redis.Redis, topic: str, partitions: int) -> dict[str, bytes]:
    """Every message of ``topic`` by its id (``<partition>-<entry id>``)."""
    stored = {}
    for partition in range(partitions):
        for entry_id, fields in redis_client.xrange(stream_key(redis_client, topic, partition)):
            stored[f"{partition}-{entry_id.decode()}"] = fields[b"d"]
    return stored


async def test_publish_many_in_runs_keeps_batch_limits_ids_and_order(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Eight concurrent publish_many calls of 10 to 300 messages without keys,
    with batches of at most 37 messages and 2,000 bytes (sizes 0 to 120 bytes):
    every write keeps both limits (only a write of one message may be larger
    than max_bytes), each call gets back the id of each of its messages in order
    (the stored message under that id is the one published), every message is
    stored exactly once, each call's messages are stored in call order, and the
    published counter counts them all."""
    redis_client.flushall()
    metrics.reset()
    backend = _Recording(server.url)
    settings = streamsub.BatchSettings(max_messages=37, max_bytes=2000, max_latency=0.01)
    calls = [
        [f"c{c}:{i}:".encode().ljust((c * 7 + i * 13) % 121, b"x") for i in range(count)]
        for c, count in enumerate([10, 300, 37, 38, 150, 1, 299, 74])
    ]
    try:
        topic = await backend.create_topic(TopicRecord("runs", 4, "", 0.0))
        publisher = TopicPublisher(backend, topic, settings)
        async with asyncio.timeout(30):
            results = await asyncio.gather(
                *(
                    publisher.publish([encode(data, max_bytes=2**20) for data in call])
                    for call in calls
                )
            )
        await publisher.aclose()
    finally:
        await backend.close()

    for write in backend.writes:
        messages = [data for partition in write.values() for data, _ in partition]
        assert 1 <= len(messages) <= settings.max_messages
        size = sum(len(data) for data in messages)
        assert size <= settings.max_bytes or len(messages) == 1, f"{size} bytes in a write"
    stored = _stored(redis_client, "runs", 4)
    assert len(stored) == sum(len(call) for call in calls)
    for call, ids in zip(calls, results, strict=True):
        assert len(ids) == len(call)
        assert [stored[message_id] for message_id in ids] == call
        # The call's messages in publish order: ids grow within each partition.
        by_partition: dict[str, list[str]] = {}
        for message_id in ids:
            partition, entry = message_id.split("-", 1)
            by_partition.setdefault(partition, []).append(entry)
        for entries in by_partition.values():
            assert entries == sorted(entries, key=lambda e: tuple(map(int, e.split("-"))))
    assert metrics.snapshot()["published"]["runs"] == len(stored)


async def test_publish_many_mixes_runs_and_keyed_messages_in_one_batch(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Calls without keys (runs), calls with keys and single publishes made at
    once, with empty data among them, land in shared batches: every id names
    the message published, and each ordering key's messages are stored in
    publish order."""
    redis_client.flushall()
    keys = [f"k{i}" for i in range(5)]
    async with streamsub.connect(server.url) as client:
        await client.create_topic("mixed", partitions=3)
        plain = [[f"p{c}:{i}".encode() for i in range(200)] + [b""] for c in range(3)]
        keyed = [
            [
                streamsub.OutgoingMessage(data=f"k{c}:{i}".encode(), ordering_key=keys[i % 5])
                for i in range(100)
            ]
            for c in range(2)
        ]
        singles = [f"s{i}".encode() for i in range(50)]
        async with asyncio.timeout(30):
            results = await asyncio.gather(
                *(client.publish_many("mixed", call) for call in plain),
                *(client.publish_many("mixed", call) for call in keyed),
                *(client.publish("mixed", data) for data in singles),
            )
    stored = _stored(redis_client, "mixed", 3)
    expected = [*plain, *[[m.data for m in call] for call in keyed], *([d] for d in singles)]
    ids = [*results[:5], *([message_id] for message_id in results[5:])]
    assert len(stored) == sum(len(call) for call in expected)
    for call, call_ids in zip(expected, ids, strict=True):
        assert [stored[message_id] for message_id in call_ids] == call
    for key in keys:
        # Each key's messages, from both keyed calls, in publish order per call.
        for c in range(2):
            key_ids = [
                message_id
                for message, message_id in zip(keyed[c], results[3 + c], strict=True)
                if message.ordering_key == key
            ]
            entries = [tuple(map(int, i.split("-", 1)[1].split("-"))) for i in key_ids]
            assert len({i.split("-", 1)[0] for i in key_ids}) == 1, "a key on two partitions"
            assert entries == sorted(entries)


async def test_a_run_whose_lengths_pass_the_batch_end_stores_nothing(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """append.lua checks a run's lengths against the batch (as struct.unpack's
    'c0' did before runs carried their lengths first): a run of one whose
    length says 101 bytes where 100 follow is refused, nothing stored; the
    same run with the right length is stored."""
    redis_client.flushall()
    backend = _Recording(server.url)
    try:
        topic = await backend.create_topic(TopicRecord("short", 1, "", 0.0))
        data = b"x" * 100
        short = b"\x00\x00" + struct.pack(">II", 1, len(data) + 1) + data
        results = await backend.append(topic, {0: short})
        assert isinstance(results[0], StreamsubError), results
        assert _stored(redis_client, "short", 1) == {}
        right = b"\x00\x00" + struct.pack(">II", 1, len(data)) + data
        (entry_id,) = (await backend.append(topic, {0: right}))[0]  # type: ignore[misc]
        assert _stored(redis_client, "short", 1) == {f"0-{entry_id}": data}
    finally:
        await backend.close()


async def test_single_publishes_of_every_shape_from_a_crowd_share_writes(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """300 callers on 4 partitions, each awaiting single publishes in turn, of
    every shape: data alone (queued as it is and packed in runs as written,
    empty data among it), with attributes, with an ordering key, and a
    ``publish_many`` now and then, so that writes hold runs of data between
    encoded messages on one partition. Every id names the message published,
    with its attributes and key; every message is stored once; each key's
    messages are on one partition."""
    redis_client.flushall()
    keys = [f"k{i}" for i in range(7)]
    published: dict[str, tuple[bytes, str | None, dict[str, str]]] = {}

    async def caller(c: int) -> None:
        for i in range(12):
            data = f"c{c}:{i}".encode() if (c + i) % 11 else b""
            shape = (c * 5 + i) % 6
            if shape == 5:
                batch = [data, b"m" + data]
                ids = await client.publish_many("shapes", batch)
                for message_id, body in zip(ids, batch, strict=True):
                    published[message_id] = (body, None, {})
                continue
            key = keys[(c + i) % 7] if shape == 3 else None
            attributes = {"caller": str(c), "n": str(i)} if shape == 4 else None
            message_id = await client.publish(
                "shapes", data, ordering_key=key, attributes=attributes
            )
            published[message_id] = (data, key, attributes or {})

    async with streamsub.connect(server.url) as client:
        await client.create_topic("shapes", partitions=4)
        async with asyncio.timeout(60):
            await asyncio.gather(*(caller(c) for c in range(300)))

    stored: dict[str, tuple[bytes, str | None, dict[str, str]]] = {}
    for partition in range(4):
        entries = redis_client.xrange(stream_key(redis_client, "shapes", partition))
        for entry_id, fields in entries:
            decoded = decode([item for pair in fields.items() for item in pair])
            stored[f"{partition}-{entry_id.decode()}"] = (
                decoded.data,
                decoded.ordering_key,
                decoded.attributes,
            )
    assert len(published) == 300 * 12 + sum(
        1 for c in range(300) for i in range(12) if (c * 5 + i) % 6 == 5
    )
    assert stored == published
    partitions_of: dict[str, set[str]] = {}
    for message_id, (_, key, _) in stored.items():
        if key is not None:
            partitions_of.setdefault(key, set()).add(message_id.split("-", 1)[0])
    assert sorted(partitions_of) == keys
    assert all(len(partitions) == 1 for partitions in partitions_of.values())


async def test_one_callers_publishes_of_every_shape_are_stored_in_publish_order(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """One caller starts 240 publishes at once on a topic of one partition, of
    every shape: data alone (in the batch's lane), with attributes, with an
    ordering key, and ``publish_many`` of data alone and of attributed
    messages, all started in one step, so that lanes, runs and encoded
    messages alternate in the batches. The stream holds them in the order they
    were published, each under the id its call returned."""
    redis_client.flushall()
    shapes = ["data", "data", "attributes", "data", "key", "many", "data", "many-attributes"]

    def publish(index: int) -> tuple[list[bytes], Awaitable[list[str]]]:
        shape, data = shapes[index % len(shapes)], f"m{index}".encode()
        if shape == "data":
            return [data], client.publish("order", data)
        if shape == "attributes":
            return [data], client.publish("order", data, attributes={"i": str(index)})
        if shape == "key":
            return [data], client.publish("order", data, ordering_key=f"k{index % 3}")
        if shape == "many":
            return [data, data + b"+"], client.publish_many("order", [data, data + b"+"])
        batch = [
            OutgoingMessage(data=data, attributes={"i": "1"}),
            OutgoingMessage(data=data + b"+"),
        ]
        return [data, data + b"+"], client.publish_many("order", batch)

    async def ids_of(call: Awaitable[str | list[str]]) -> list[str]:
        ids = await call
        return ids if isinstance(ids, list) else [ids]

    async with streamsub.connect(server.url) as client:
        await client.create_topic("order", partitions=1)
        await client.publish("order", b"warm-up")  # the topic's publisher is at hand
        published = [publish(index) for index in range(240)]
        async with asyncio.timeout(30):
            returned = await asyncio.gather(*(ids_of(call) for _, call in published))
    stored = [
        (f"0-{entry_id.decode()}", fields[b"d"])
        for entry_id, fields in redis_client.xrange(stream_key(redis_client, "order", 0))
    ][1:]
    expected = [
        (message_id, data)
        for (datas, _), ids in zip(published, returned, strict=True)
        for message_id, data in zip(ids, datas, strict=True)
    ]
    assert len(stored) == 240 + 60
    assert stored == expected


async def test_queued_tokens_hold_what_was_published(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """The tokens the publisher queues (built without the named tuple's
    ``__new__``, see ``_new_token``) hold every field: for three single
    publishes of data alone, the lane's (its data and futures, no key, their
    size, three messages), turned into an entry before the keyed publish that
    follows on the same partition; for the keyed one, its future, key, size
    and one message. All are stored under the ids they return."""
    redis_client.flushall()
    async with streamsub.connect(server.url) as client:
        await client.create_topic("tokens", partitions=1)
        await client.publish("tokens", b"warm-up")  # the topic's publisher is at hand
        publisher = client._publishers["tokens"]
        plain = [publisher.submit_one(b"plain-%d" % i) for i in range(3)]
        keyed = publisher.submit_one(encode(b"keyed", "k", max_bytes=2**20))
        # Still in the open batch: no await since they were queued.
        (lane_entry, keyed_entry) = publisher._batcher._open[0]
        lane = lane_entry[1].waiter
        assert isinstance(lane, _Lane)
        assert (lane.datas, lane.futures) == ([b"plain-0", b"plain-1", b"plain-2"], plain)
        assert lane_entry[1] == _Token(waiter=lane, position=0, key=None, size=21, length=3)
        assert keyed_entry[1] == _Token(waiter=keyed, position=0, key="k", size=6, length=1)
        assert [len(entry[1]) for entry in (lane_entry, keyed_entry)] == [len(_Token._fields)] * 2
        async with asyncio.timeout(10):
            ids = [await future for future in [*plain, keyed] if future is not None]
    stored = _stored(redis_client, "tokens", 1)
    assert [stored[message_id] for message_id in ids] == [
        b"plain-0",
        b"plain-1",
        b"plain-2",
        b"keyed",
    ]
