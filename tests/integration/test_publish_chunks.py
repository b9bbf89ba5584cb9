"""A large publish_many of messages that are data alone is packed a chunk at a
time, and its first writes go while the rest is packed: the ids, the stored
messages, their order, flow control, bad input, a cancel and a failed write are
as if the call were queued whole.

The recording backend is a real backend on the test server with ``append``
wrapped; Redis itself is not imitated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import redis

import streamsub
from streamsub._backends.base import Link, TopicRecord
from streamsub._core.codec import unpack_fields
from streamsub._engine import publisher as publisher_module
from streamsub._engine.publisher import FIRST_CHUNK
from streamsub._errors import StreamsubError
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND, stream_key
from tests._wait import until

PARTITIONS = 4


class _Recording(TEST_BACKEND):
    """Records each write's message count and how many messages had been
    packed when it started; ``fail_write`` (counted from 1) fails that write."""

    def __init__(
        self, url: str, fail_write: int | None = None, cancel: asyncio.Task[Any] | None = None
    ) -> None:
        super().__init__(url)
        self.writes: list[tuple[int, int]] = []
        self.packed = 0
        self.first_write = asyncio.Event()
        self._fail_write = fail_write
        self.cancel = cancel
        """A task cancelled as the failing write fails (in the same loop turn)."""

    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        count = sum(len(unpack_fields(packed)) // 2 for packed in batch.values())
        self.writes.append((count, self.packed))
        self.first_write.set()
        if len(self.writes) == self._fail_write:
            if self.cancel is not None:
                self.cancel.cancel()
            raise streamsub.UnavailableError("the test fails this write")
        return await super().append(topic, batch, links)


@pytest.fixture(autouse=True)
def untraced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracing off, as by default, whatever earlier tests set up: a traced
    publish carries its context in each message, which is not data alone."""
    monkeypatch.setattr(streamsub.tracing, "active", lambda: False)


@pytest.fixture
def packing(monkeypatch: pytest.MonkeyPatch) -> list[_Recording]:
    """Backends made here count the messages the publisher packs."""
    backends: list[_Recording] = []
    pack = publisher_module.pack_data

    def counted(datas: Sequence[bytes], sizes: Sequence[int]) -> bytes:
        for backend in backends:
            backend.packed += len(datas)
        return pack(datas, sizes)

    monkeypatch.setattr(publisher_module, "pack_data", counted)
    return backends


def _entries(redis_client: redis.Redis, topic: str) -> dict[str, dict[bytes, bytes]]:
    """Every entry's fields of ``topic`` by its id (``<partition>-<entry id>``)."""
    entries = {}
    for partition in range(PARTITIONS):
        for entry_id, fields in redis_client.xrange(stream_key(redis_client, topic, partition)):
            entries[f"{partition}-{entry_id.decode()}"] = fields
    return entries


def _stored(redis_client: redis.Redis, topic: str) -> dict[str, bytes]:
    """Every message's data of ``topic`` by its id."""
    entries = _entries(redis_client, topic)
    return {message_id: fields[b"d"] for message_id, fields in entries.items()}


def _in_order_per_partition(ids: list[str]) -> bool:
    """Whether, within each partition, ``ids`` grow (a call's messages stored in
    call order)."""
    last: dict[str, tuple[int, ...]] = {}
    for message_id in ids:
        partition, entry = message_id.split("-", 1)
        seq = tuple(map(int, entry.split("-")))
        if partition in last and seq <= last[partition]:
            return False
        last[partition] = seq
    return True


def _call(name: str, count: int) -> list[streamsub.OutgoingMessage | bytes]:
    """``count`` messages that are data alone, as users pass them: bytes and
    OutgoingMessage mixed, sizes 0 to 60 bytes."""
    return [
        (
            f"{name}:{i}:".encode().ljust(i % 61, b"x")[: max(i % 61, len(f"{name}:{i}:"))]
            if i % 3
            else streamsub.OutgoingMessage(data=f"{name}:{i}".encode())
        )
        for i in range(count)
    ]


def _data(call: list[streamsub.OutgoingMessage | bytes]) -> list[bytes]:
    return [m.data if isinstance(m, streamsub.OutgoingMessage) else m for m in call]


async def test_a_large_publish_many_writes_its_first_chunk_while_packing_the_rest(
    server: RedisServer, redis_client: redis.Redis, packing: list[_Recording]
) -> None:
    """One call of 5,000 messages: its first write carries the first chunk and
    starts before the call's last message is packed; every message is stored
    once under the id returned for it, in call order per partition, over
    several partitions."""
    redis_client.flushall()
    backend = _Recording(server.url)
    packing.append(backend)
    call = _call("big", 5000)
    async with streamsub.Client(backend) as client:
        await client.create_topic("chunks", partitions=PARTITIONS)
        async with asyncio.timeout(30):
            ids = await client.publish_many("chunks", call)
    first_count, packed_before = backend.writes[0]
    assert first_count == FIRST_CHUNK
    assert packed_before < len(call), backend.writes
    assert sum(count for count, _ in backend.writes) == len(call)
    stored = _stored(redis_client, "chunks")
    assert len(stored) == len(call)
    assert [stored[message_id] for message_id in ids] == _data(call)
    assert _in_order_per_partition(ids)
    assert len({message_id.split("-", 1)[0] for message_id in ids}) > 1


async def test_concurrent_large_calls_keyed_calls_and_publishes_share_writes(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """Three chunked calls of 3,000, two keyed calls and 200 single publishes at
    once, with batches of at most 500 messages: each call's ids name its
    messages, in call order per partition (per key for the keyed ones), and
    every message is stored exactly once."""
    redis_client.flushall()
    batch = streamsub.BatchSettings(max_messages=500)
    plain = [_call(f"c{c}", 3000) for c in range(3)]
    keyed = [
        [
            streamsub.OutgoingMessage(data=f"k{c}:{i}".encode(), ordering_key=f"key{i % 7}")
            for i in range(400)
        ]
        for c in range(2)
    ]
    singles = [f"s{i}".encode() for i in range(200)]
    async with streamsub.connect(server.url, batch_settings=batch) as client:
        await client.create_topic("chunks", partitions=PARTITIONS)
        async with asyncio.timeout(60):
            results = await asyncio.gather(
                *(client.publish_many("chunks", call) for call in plain),
                *(client.publish_many("chunks", call) for call in keyed),
                *(client.publish("chunks", data) for data in singles),
            )
    stored = _stored(redis_client, "chunks")
    expected = [*map(_data, plain), *([m.data for m in call] for call in keyed)]
    assert len(stored) == sum(map(len, expected)) + len(singles)
    for call, ids in zip(expected, results[:5], strict=True):
        assert [stored[message_id] for message_id in ids] == call
        assert _in_order_per_partition(ids)
    assert sorted(stored[message_id] for message_id in results[5:]) == sorted(singles)
    # Runs of data alone and keyed messages share writes: each entry has
    # exactly its own fields.
    entries = _entries(redis_client, "chunks")
    for call, ids in zip(keyed, results[3:5], strict=True):
        for message, message_id in zip(call, ids, strict=True):
            assert message.ordering_key is not None
            key = message.ordering_key.encode()
            assert entries[message_id] == {b"d": message.data, b"k": key}
    alone = [*results[0], *results[1], *results[2], *results[5:]]
    assert all(list(entries[message_id]) == [b"d"] for message_id in alone)


async def test_a_bad_message_at_the_end_of_a_large_call_writes_nothing(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """10,000 messages of which the last is over the size limit: the call fails
    naming it, and no message of it is stored (the check comes before any write)."""
    redis_client.flushall()
    limits = streamsub.Limits(max_message_bytes=100)
    call = [*_call("bad", 9999), b"x" * 101]
    async with streamsub.connect(server.url, limits=limits) as client:
        await client.create_topic("chunks", partitions=PARTITIONS)
        with pytest.raises(streamsub.MessageTooLargeError, match="message 9999: message is 101"):
            await client.publish_many("chunks", call)
        assert await client.publish_many("chunks", call[:-1]) != []
    assert len(_stored(redis_client, "chunks")) == 9999


async def test_flow_control_refuses_or_admits_a_large_call_as_a_whole(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With ERROR at 4,000 messages a call of 5,000 is refused and nothing of it
    is stored; with BLOCK, two calls of 3,000 at once wait for each other's
    room and both are stored whole."""
    redis_client.flushall()
    error = streamsub.PublishFlowControl(
        message_limit=4000, limit_exceeded_behavior=streamsub.LimitExceededBehavior.ERROR
    )
    async with streamsub.connect(server.url, publish_flow_control=error) as client:
        await client.create_topic("chunks", partitions=PARTITIONS)
        with pytest.raises(streamsub.FlowControlLimitError):
            await client.publish_many("chunks", _call("over", 5000))
    assert _stored(redis_client, "chunks") == {}
    block = streamsub.PublishFlowControl(message_limit=4000)
    calls = [_call(f"b{c}", 3000) for c in range(2)]
    async with streamsub.connect(server.url, publish_flow_control=block) as client:
        async with asyncio.timeout(30):
            results = await asyncio.gather(*(client.publish_many("chunks", c) for c in calls))
        assert client._publish_gate.outstanding == (0, 0)
    stored = _stored(redis_client, "chunks")
    assert len(stored) == 6000
    for call, ids in zip(calls, results, strict=True):
        assert [stored[message_id] for message_id in ids] == _data(call)


async def test_a_call_cancelled_while_packing_still_stores_every_message(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A call of 20,000 cancelled as its first write starts: as with any
    admitted publish, all of its messages are still queued and stored, in call
    order per partition."""
    redis_client.flushall()
    backend = _Recording(server.url)
    call = _call("cancelled", 20_000)
    async with streamsub.Client(backend) as client:
        await client.create_topic("chunks", partitions=PARTITIONS)
        publishing = asyncio.create_task(client.publish_many("chunks", call))
        await backend.first_write.wait()
        publishing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await publishing
        assert len(backend.writes) < 5, "cancelled too late to test anything"
    stored = list(_stored(redis_client, "chunks").items())
    assert sorted(data for _, data in stored) == sorted(_data(call))
    # Per partition, in the order stored, the call's messages in call order.
    position = {data: i for i, data in enumerate(_data(call))}
    by_partition: dict[str, list[int]] = {}
    for message_id, data in stored:
        by_partition.setdefault(message_id.split("-", 1)[0], []).append(position[data])
    assert all(p == sorted(p) for p in by_partition.values())


async def test_a_failed_write_stops_the_rest_of_the_call_and_gives_its_room_back(
    server: RedisServer, redis_client: redis.Redis, packing: list[_Recording]
) -> None:
    """A call of 20,000 whose first write fails (connection lost): the call
    fails with that error, the chunks not yet queued are not written, and flow
    control gets the whole call's share back, so later publishes go."""
    redis_client.flushall()
    backend = _Recording(server.url, fail_write=1)
    packing.append(backend)
    call = _call("failed", 20_000)
    async with streamsub.Client(backend) as client:
        await client.create_topic("chunks", partitions=PARTITIONS)
        with pytest.raises(streamsub.UnavailableError, match="the test fails this write"):
            await client.publish_many("chunks", call)
        # The writes in flight behind the failed one come back failed too.
        gate = client._publish_gate
        await until(lambda: gate.outstanding == (0, 0), 10, "the call's room given back")
        assert backend.packed < len(call), "the whole call was packed"
        assert len(await client.publish_many("chunks", call[:10])) == 10
    assert len(_stored(redis_client, "chunks")) < len(call)


async def test_a_call_cancelled_as_its_write_fails_gives_all_its_room_back(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A call of 20,000 cancelled in the loop turn in which its first write
    fails (an ``asyncio.timeout`` and a lost connection at once): the chunks
    not yet queued stay out and give their flow-control room back, so that
    later publishes on the client still go (with the default BLOCK limit of
    10,000 messages, a leak would block them for ever)."""
    redis_client.flushall()
    backend = _Recording(server.url, fail_write=1)
    call = _call("cancelled", 20_000)
    async with streamsub.Client(backend) as client:
        await client.create_topic("chunks", partitions=PARTITIONS)
        publishing = asyncio.create_task(client.publish_many("chunks", call))
        backend.cancel = publishing
        with pytest.raises((asyncio.CancelledError, streamsub.UnavailableError)):
            await publishing
        gate = client._publish_gate
        await until(lambda: gate.outstanding == (0, 0), 10, "the call's room given back")
        async with asyncio.timeout(10):
            assert len(await client.publish_many("chunks", call[:10_000])) == 10_000


async def test_a_chunk_holds_at_most_a_batch_of_bytes(
    server: RedisServer, redis_client: redis.Redis, packing: list[_Recording]
) -> None:
    """2,000 messages of 4 KiB with batches of at most 64 KiB: the first write
    starts once one batch's worth (16 messages) is packed, not a chunk of 128
    messages (eight batches); every message is stored once, in call order."""
    redis_client.flushall()
    backend = _Recording(server.url)
    packing.append(backend)
    batch = streamsub.BatchSettings(max_bytes=64 * 1024)
    call = [f"{i}:".encode().ljust(4096, b"x") for i in range(2000)]
    async with streamsub.Client(backend, batch_settings=batch) as client:
        await client.create_topic("chunks", partitions=PARTITIONS)
        async with asyncio.timeout(30):
            ids = await client.publish_many("chunks", call)
    first_count, packed_before = backend.writes[0]
    assert first_count == packed_before == 16, backend.writes[:3]
    stored = _stored(redis_client, "chunks")
    assert [stored[message_id] for message_id in ids] == call
    assert _in_order_per_partition(ids)
