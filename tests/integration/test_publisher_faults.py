"""The publisher under a misbehaving backend: a dying flusher never leaves a publish
hanging, nor its writes in flight uncounted; a batch routed wrongly fails as a
whole; and a slow backend makes publishers wait instead of queueing without bound.

The backends here are real RedisBackends on the test server with one method
wrapped: they fail or stall on purpose, Redis itself is not imitated.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence

import pytest
import redis

import streamsub
from streamsub._backends.base import BrokenLinkError, Link, TopicRecord
from streamsub._core.codec import encode
from streamsub._engine import publisher as publisher_module
from streamsub._engine.publisher import MAX_IN_FLIGHT, PublishGate, TopicPublisher
from streamsub._errors import (
    OrderingKeyPausedError,
    StreamsubError,
    TopicNotFoundError,
    UnavailableError,
)
from streamsub.testing import RedisServer
from tests._layout import TEST_BACKEND, stream_key
from tests._wait import until


class _FailsOnce(TEST_BACKEND):
    """Its first append raises ``error`` (not a streamsub error); later ones work."""

    def __init__(self, url: str, error: BaseException) -> None:
        super().__init__(url)
        self.error: BaseException | None = error

    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return await super().append(topic, batch, links)


class _RoutingFailsOnce(TEST_BACKEND):
    """Its first ``write_groups`` (where a batch's partitions go) raises
    ``RuntimeError``; later ones work."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.failed = False

    def write_groups(
        self, topic: TopicRecord, partitions: Iterable[int]
    ) -> dict[str | None, list[int]] | None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("boom")
        return super().write_groups(topic, partitions)


class _MisplacesOnce(TEST_BACKEND):
    """Its first ``write_groups`` leaves a batch's last partition out
    (``omits``), places its first partition on two nodes (``twice``), or names
    a node with no partition (``empty``); later ones work."""

    def __init__(self, url: str, how: str) -> None:
        super().__init__(url)
        self.how = how
        self.failed = False

    def write_groups(
        self, topic: TopicRecord, partitions: Iterable[int]
    ) -> dict[str | None, list[int]] | None:
        if self.failed:
            return super().write_groups(topic, partitions)
        self.failed = True
        placed = list(partitions)
        if self.how == "omits":
            return {"node-a": placed[:-1]}
        if self.how == "empty":
            return {"node-a": placed, "node-b": []}
        return {"node-a": placed, "node-b": placed[:1]}


class _ShortOnce(TEST_BACKEND):
    """Its first append's answer lacks the last id of one partition; later ones are whole."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.done = False

    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        results = await super().append(topic, batch, links)
        if not self.done:
            self.done = True
            partition, ids = next(iter(results.items()))
            if isinstance(ids, list):
                results[partition] = ids[:-1]
        return results


class _Gated(TEST_BACKEND):
    """Appends wait until the gate opens (a backend that has gone slow), then
    raise ``error`` if one is given."""

    def __init__(self, url: str, error: StreamsubError | None = None) -> None:
        super().__init__(url)
        self.gate = asyncio.Event()
        self.started = 0
        self.error = error

    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        self.started += 1
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return await super().append(topic, batch, links)


class _HeldSomeDie(TEST_BACKEND):
    """Appends wait until :meth:`open` (a slow backend), the first ``dying``
    of them until ``first`` is set; those then raise a non-streamsub error,
    the others go on. Counts the appends under way, in all and on the node
    that takes each (one on a single server)."""

    def __init__(self, url: str, dying: int = 1) -> None:
        super().__init__(url)
        self.dying = dying
        self.opened = asyncio.Event()
        self.first = asyncio.Event()
        self.calls = 0
        self.active = 0
        self.on_node: dict[str | None, int] = {}
        self.most_on_a_node = 0

    def open(self) -> None:
        self.first.set()
        self.opened.set()

    async def append(
        self,
        topic: TopicRecord,
        batch: Mapping[int, bytes],
        links: Mapping[int, Link] | None = None,
    ) -> dict[int, list[str] | StreamsubError]:
        self.calls += 1
        dies = self.calls <= self.dying
        groups = self.write_groups(topic, list(batch))
        node = next(iter(groups)) if groups else None  # a write goes to one node
        self.active += 1
        self.on_node[node] = self.on_node.get(node, 0) + 1
        self.most_on_a_node = max(self.most_on_a_node, self.on_node[node])
        try:
            await (self.first if dies else self.opened).wait()
            if dies:
                raise RuntimeError("boom")
            return await super().append(topic, batch, links)
        finally:
            self.active -= 1
            self.on_node[node] -= 1


def _stored(redis_client: redis.Redis, topic: str, partitions: int) -> set[str]:
    return {
        f"{p}-{entry_id.decode()}"
        for p in range(partitions)
        for entry_id, _ in redis_client.xrange(stream_key(redis_client, topic, p))
    }


@pytest.mark.parametrize(
    "error", [RuntimeError("boom"), asyncio.CancelledError()], ids=["exception", "cancelled"]
)
async def test_a_dying_flusher_fails_waiting_publishes_and_the_next_publish_restarts_it(
    server: RedisServer,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    error: BaseException,
) -> None:
    """A backend append that raises a non-streamsub error (or a stray CancelledError)
    kills the publisher's flusher: the publishes of that batch and those queued
    behind it raise BackendError saying so (none hangs), and the next publish
    starts it anew and is stored."""
    caplog.set_level(logging.ERROR, logger="streamsub")
    redis_client.flushall()
    backend = _FailsOnce(server.url, error)
    async with streamsub.Client(
        backend, batch_settings=streamsub.BatchSettings(max_messages=10)
    ) as client:
        await client.create_topic("flaky", partitions=2)
        chunks = [[f"{c}-{i}".encode() for i in range(10)] for c in range(MAX_IN_FLIGHT + 3)]
        async with asyncio.timeout(10):  # a publish left hanging fails here, not at 120 s
            results = await asyncio.gather(
                *(client.publish_many("flaky", chunk) for chunk in chunks),
                return_exceptions=True,
            )
        first = results[0]
        assert isinstance(first, streamsub.BackendError), first
        assert "unexpected error" in str(first)
        assert first.__cause__ is error
        for result in results:
            assert isinstance(result, list | streamsub.BackendError), result
        assert any("stopped on an unexpected error" in r.getMessage() for r in caplog.records)

        async with asyncio.timeout(10):
            after = await client.publish_many("flaky", [b"after"])
        stored = [i for r in results if isinstance(r, list) for i in r] + after
    assert set(stored) <= _stored(redis_client, "flaky", 2)


def _publish_tens(
    client: streamsub.Client, topic: str
) -> Callable[[str], asyncio.Future[list[str]]]:
    def call(name: str) -> asyncio.Future[list[str]]:
        return asyncio.ensure_future(
            client.publish_many(topic, [b"%s-%d" % (name.encode(), i) for i in range(10)])
        )

    return call


@pytest.mark.parametrize("restarted", [True, False], ids=["restarted", "not-restarted"])
async def test_a_close_waits_for_the_writes_a_dead_flusher_left_and_a_new_one_counts_them(
    server: RedisServer, redis_client: redis.Redis, restarted: bool
) -> None:
    """Four writes are in flight (the most a publisher has) when the first dies
    on an unexpected error, taking the flusher with it. With ``restarted``, four
    more calls start a new flusher, which counts the three still in flight: no
    more than four writes are ever under way on a node. The client is closed while those
    three are held: the close waits for them, whether a new flusher started or
    not. Each of their calls is stored, or was linked behind the write that
    died on its partition and stored nothing."""
    redis_client.flushall()
    backend = _HeldSomeDie(server.url)
    async with (
        asyncio.timeout(15),  # a close that waits for ever fails here
        streamsub.Client(
            backend, batch_settings=streamsub.BatchSettings(max_messages=10)
        ) as client,
    ):
        await client.create_topic("held", partitions=2)
        call = _publish_tens(client, "held")
        first = [call(f"first-{c}") for c in range(MAX_IN_FLIGHT)]
        await until(lambda: backend.active == MAX_IN_FLIGHT, 5, "four writes in flight")
        backend.first.set()  # the first write dies, and the flusher with it
        with pytest.raises(streamsub.BackendError, match="unexpected error"):
            await first[0]
        later = []
        if restarted:
            later = [call(f"later-{c}") for c in range(MAX_IN_FLIGHT)]
            await until(lambda: backend.calls > MAX_IN_FLIGHT, 5, "a new flusher writes")
            await asyncio.sleep(0.1)  # it would start the rest of its writes now
            assert backend.most_on_a_node <= MAX_IN_FLIGHT
        asyncio.get_running_loop().call_later(0.3, backend.open)
    # Closed: the close waited for every write in flight, the dead flusher's too.
    assert all(call.done() for call in [*first, *later])
    async with asyncio.timeout(5):
        results = await asyncio.gather(*first[1:], *later, return_exceptions=True)
    for result in results:
        assert isinstance(result, list | BrokenLinkError), result
    # The calls on the other of the two partitions were linked behind no failure.
    assert sum(isinstance(result, list) for result in results) >= 1 + restarted
    assert backend.most_on_a_node <= MAX_IN_FLIGHT
    assert {i for r in results if isinstance(r, list) for i in r} == _stored(
        redis_client, "held", 2
    )


async def test_writes_that_die_together_fail_their_own_calls_and_not_the_next_ones(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """All four writes in flight die on an unexpected error: the first takes the
    flusher with it, and each fails its own call. The next ten calls start a
    new flusher and are stored: the three other deaths, already answered, do
    not take the new flusher with them and fail calls that had no part in them."""
    redis_client.flushall()
    backend = _HeldSomeDie(server.url, dying=MAX_IN_FLIGHT)
    backend.opened.set()
    async with streamsub.Client(
        backend, batch_settings=streamsub.BatchSettings(max_messages=10)
    ) as client:
        await client.create_topic("dying", partitions=2)
        call = _publish_tens(client, "dying")
        first = [call(f"first-{c}") for c in range(MAX_IN_FLIGHT)]
        await until(lambda: backend.active == MAX_IN_FLIGHT, 5, "four writes in flight")
        backend.first.set()
        async with asyncio.timeout(5):
            died = await asyncio.gather(*first, return_exceptions=True)
        for result in died:
            assert isinstance(result, streamsub.BackendError), result
            assert "unexpected error" in str(result)
        async with asyncio.timeout(5):
            after = await asyncio.gather(*(call(f"after-{c}") for c in range(10)))
    assert {i for ids in after for i in ids} == _stored(redis_client, "dying", 2)


def _ids(results: list[object]) -> list[str]:
    """The ids among gathered publish results (ids, lists of ids, errors)."""
    found: list[str] = []
    for result in results:
        if isinstance(result, str):
            found.append(result)
        elif isinstance(result, list):
            found += result
    return found


def _routing_error(result: object) -> bool:
    return isinstance(result, streamsub.BackendError) and "routing a batch failed" in str(result)


async def test_a_keyed_call_whose_first_batch_cannot_be_routed_stores_none_of_its_key(
    server: RedisServer, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``publish_many`` of 25 messages under one key, in batches of 10: the
    first batch's routing fails on an unexpected error. The call raises
    BackendError saying so, none of the key's messages is stored (its later
    batches fail behind the first: the key's order holds), the key is paused
    until resumed, and then its messages are stored in order."""
    caplog.set_level(logging.ERROR, logger="streamsub")
    redis_client.flushall()
    backend = _RoutingFailsOnce(server.url)
    async with streamsub.Client(
        backend, batch_settings=streamsub.BatchSettings(max_messages=10)
    ) as client:
        await client.create_topic("routing", partitions=4)
        messages = [
            streamsub.OutgoingMessage(data=b"k-%d" % i, ordering_key="k") for i in range(25)
        ]
        async with asyncio.timeout(10):  # a publish left hanging fails here
            (result,) = await asyncio.gather(
                client.publish_many("routing", messages), return_exceptions=True
            )
        assert _routing_error(result), result
        assert any("routing a batch failed" in r.getMessage() for r in caplog.records)
        with pytest.raises(OrderingKeyPausedError):
            await client.publish("routing", b"k-late", ordering_key="k")
        # The call's later batches may still be on their way (behind the
        # failed one, they fail and pause the key too): resumed once all are back.
        gate = client._publish_gate
        await until(lambda: gate.outstanding == (0, 0), 10, "the call's writes back")
        client.resume_publish("routing", "k")
        async with asyncio.timeout(10):
            again = await client.publish_many("routing", messages)
        assert client._publishers["routing"].queued == (0, 0)
        assert gate.outstanding == (0, 0)
    # The second call's messages only, in order: nothing of the first was stored.
    assert set(again) == _stored(redis_client, "routing", 4)
    assert again == sorted(again, key=lambda i: tuple(map(int, i.split("-"))))


@pytest.mark.parametrize("shape", ["single", "many"])
@pytest.mark.parametrize("routing", ["raises", "omits", "twice", "empty"])
async def test_publishes_in_a_batch_that_cannot_be_routed_fail_and_later_ones_are_stored(
    server: RedisServer, redis_client: redis.Redis, shape: str, routing: str
) -> None:
    """The first batch's routing fails on an unexpected error, or places a
    partition nowhere or twice, with 30 single publishes queued in one step,
    or a ``publish_many`` of 300 messages of data alone (written a chunk at a
    time) in batches of 10: the publishes of that batch raise BackendError
    saying so, none hangs, the publisher's queue and flow control's room are
    given back, and the publishes after it are stored, each id once."""
    redis_client.flushall()
    backend = (
        _RoutingFailsOnce(server.url)
        if routing == "raises"
        else _MisplacesOnce(server.url, routing)
    )
    async with streamsub.Client(
        backend, batch_settings=streamsub.BatchSettings(max_messages=10)
    ) as client:
        await client.create_topic("routing", partitions=4)
        if shape == "single":
            calls = [client.publish("routing", b"one-%d" % i) for i in range(30)]
        else:
            calls = [client.publish_many("routing", [b"many-%d" % i for i in range(300)])]
        async with asyncio.timeout(10):  # a publish left hanging fails here
            results = await asyncio.gather(*calls, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        assert failed
        assert all(_routing_error(r) for r in failed), failed
        if shape == "single":
            assert len(failed) == 10, results  # the first batch's
        async with asyncio.timeout(10):
            after = await asyncio.gather(
                *(client.publish("routing", b"after-%d" % i) for i in range(30)),
                client.publish_many("routing", [b"after-many-%d" % i for i in range(25)]),
            )
        assert client._publishers["routing"].queued == (0, 0)
        # A failed call's other chunks may still be on their way (a call fails
        # with its first failed batch): their room comes back as they end.
        gate = client._publish_gate
        await until(lambda: gate.outstanding == (0, 0), 10, "every write's room back")
    ids = _ids(results) + _ids(after)
    assert len(ids) == len(set(ids))
    stored = _stored(redis_client, "routing", 4)
    assert set(ids) <= stored
    if shape == "single":
        assert set(ids) == stored
    else:  # a call that failed may have had later chunks stored, never the failed batch
        assert len(stored) <= len(ids) + 300 - 10


async def test_a_write_whose_ids_do_not_match_fails_its_publishes(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A backend that answers a write with one id too few for a partition (a
    bug: the publisher cannot tell whose id is missing): the write's publishes
    fail with BackendError, none hangs, and the next publishes are stored."""
    redis_client.flushall()
    backend = _ShortOnce(server.url)
    async with streamsub.Client(
        backend, batch_settings=streamsub.BatchSettings(max_messages=10)
    ) as client:
        await client.create_topic("short", partitions=2)
        async with asyncio.timeout(10):  # a publish left hanging fails here
            results = await asyncio.gather(
                *(client.publish("short", b"one-%d" % i) for i in range(20)),
                client.publish_many("short", [b"many-%d" % i for i in range(20)]),
                return_exceptions=True,
            )
        failed = [r for r in results if isinstance(r, BaseException)]
        assert failed
        assert all(isinstance(r, streamsub.BackendError) for r in failed), failed
        async with asyncio.timeout(10):
            after = await asyncio.gather(*(client.publish("short", b"after") for _ in range(20)))
        assert client._publish_gate.outstanding == (0, 0)
    assert set(_ids(results) + after) <= _stored(redis_client, "short", 2)


async def test_publish_waits_for_room_while_the_queue_is_full(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """With writes stalled, publishes fill PublishFlowControl's message_limit (batches
    in flight and queued); the next publish waits without queueing its messages, and
    once writes go on every publish completes, each key's messages stored in
    publish order. (One partition: on a cluster, one master, whose four writes
    in flight are the publisher's.)"""
    redis_client.flushall()
    backend = _Gated(server.url)
    settings = streamsub.BatchSettings(max_messages=10, max_latency=0.001)
    gate = PublishGate(streamsub.PublishFlowControl(message_limit=10 * (MAX_IN_FLIGHT + 10)))
    try:
        topic = await backend.create_topic(TopicRecord("pressure", 1, "", 0.0))
        publisher = TopicPublisher(backend, topic, settings, gate=gate)

        def calls(start: int, count: int) -> list[asyncio.Task[list[str]]]:
            return [
                asyncio.ensure_future(
                    publisher.publish(
                        [
                            encode(f"{c}:{i}".encode(), f"key-{i % 3}", max_bytes=2**20)
                            for i in range(10)
                        ]
                    )
                )
                for c in range(start, start + count)
            ]

        in_flight = calls(0, MAX_IN_FLIGHT)
        await until(lambda: backend.started == MAX_IN_FLIGHT, 5, "four writes in flight")
        queued = calls(MAX_IN_FLIGHT, 10)
        await until(lambda: publisher.queued[0] == 10 * 10, 5, "a full queue")
        late = calls(MAX_IN_FLIGHT + 10, 2)
        await until(lambda: gate.waiting == 2, 5, "publishes waiting for room")
        assert publisher.queued[0] == 10 * 10, "a waiting publish was queued"
        assert gate.outstanding[0] == 10 * (MAX_IN_FLIGHT + 10)

        backend.gate.set()
        async with asyncio.timeout(10):
            await asyncio.gather(*in_flight, *queued, *late)
        assert publisher.queued == (0, 0)
        assert gate.outstanding == (0, 0)
        await publisher.aclose()
    finally:
        await backend.close()

    stored: dict[str, list[bytes]] = {f"key-{k}": [] for k in range(3)}
    for partition in range(1):
        for _, fields in redis_client.xrange(stream_key(redis_client, "pressure", partition)):
            stored[fields[b"k"].decode()].append(fields[b"d"])
    total = MAX_IN_FLIGHT + 10 + 2
    for k in range(3):
        expected = [f"{c}:{i}".encode() for c in range(total) for i in range(10) if i % 3 == k]
        assert stored[f"key-{k}"] == expected, f"key-{k} out of order"


@pytest.mark.parametrize(
    "error",
    [UnavailableError("the connection was lost"), TopicNotFoundError("the topic was deleted")],
    ids=["lost", "deleted"],
)
async def test_single_publishes_fail_with_the_write_error_and_give_their_room_back(
    server: RedisServer, error: StreamsubError
) -> None:
    """60 publishes of one message (each its own future, no waiter: submit_one),
    every other one keyed on 5 keys, the others data alone (in the batch's
    lane), in flight and queued behind writes that
    fail, 10 of them cancelled while queued: every other one fails with the
    write's error (a keyed one queued behind its key's failure: with
    OrderingKeyPausedError), the cancelled stay cancelled, every key pauses,
    nothing stays queued or counted in flow control or the crowd; a deleted topic is
    reported once (on_gone), and the publisher then refuses with it."""
    backend = _Gated(server.url, error)
    gate = PublishGate(streamsub.PublishFlowControl())
    gone: list[TopicPublisher] = []
    try:
        topic = await backend.create_topic(TopicRecord("failing", 4, "", 0.0))
        publisher = TopicPublisher(
            backend, topic, streamsub.BatchSettings(max_messages=10), gate=gate, on_gone=gone.append
        )
        futures: list[asyncio.Future[str]] = []
        for i in range(60):
            key = f"key-{i % 5}" if i % 2 else None
            data = b"m%d" % i
            future = publisher.submit_one(encode(data, key, max_bytes=2**20) if key else data)
            assert future is not None
            futures.append(future)
            if i % 10 == 9:
                await asyncio.sleep(0)  # writes start; the later publishes queue behind
        cancelled = futures[35:45]
        for future in cancelled:
            future.cancel()
        backend.gate.set()
        async with asyncio.timeout(10):
            results = await asyncio.gather(*futures, return_exceptions=True)
        for i, (future, result) in enumerate(zip(futures, results, strict=True)):
            if future in cancelled:
                assert isinstance(result, asyncio.CancelledError), (i, result)
            elif i % 2 == 0:
                assert result is error, (i, result)
            else:
                assert result is error or isinstance(result, OrderingKeyPausedError), (i, result)
        assert all(publisher.paused(f"key-{k}") for k in range(5))
        assert publisher.queued == (0, 0)
        assert gate.outstanding == (0, 0)
        assert publisher._crowd.outstanding == 0
        await publisher.aclose()
        if isinstance(error, TopicNotFoundError):
            assert gone == [publisher]
            with pytest.raises(TopicNotFoundError, match="the topic was deleted"):
                publisher.submit_one(encode(b"late", max_bytes=2**20))
        else:
            assert gone == []
    finally:
        await backend.close()


async def test_a_batch_that_cannot_be_packed_fails_its_publishes_and_later_ones_are_stored(
    server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packing a write's single publishes of data alone (as one run, when the
    write is built) raises an unexpected error for one batch: 30 single
    publishes queued in one step, in batches of 10, with attributes on some of
    them. The publishes of that batch raise BackendError saying so, none hangs,
    flow control's room comes back, and later publishes are stored, each once."""
    redis_client.flushall()
    packed = publisher_module.pack_data

    def pack_data(datas: Sequence[bytes], sizes: Sequence[int]) -> bytes:
        if b"poison" in datas:
            raise struct.error("'I' format requires 0 <= number <= 4294967295")
        return packed(datas, sizes)

    monkeypatch.setattr(publisher_module, "pack_data", pack_data)
    async with streamsub.Client(
        TEST_BACKEND(server.url), batch_settings=streamsub.BatchSettings(max_messages=10)
    ) as client:
        await client.create_topic("packing", partitions=4)
        await client.publish("packing", b"warm-up")
        calls = [
            client.publish(
                "packing",
                b"poison" if i == 3 else b"one-%d" % i,
                attributes={"n": str(i)} if i % 4 == 0 else None,
            )
            for i in range(30)
        ]
        async with asyncio.timeout(10):  # a publish left hanging fails here
            results = await asyncio.gather(*calls, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        # The first batch's, poison among them; the other two batches were
        # started beside it and are stored.
        assert [i for i, r in enumerate(results) if isinstance(r, BaseException)] == list(
            range(10)
        ), results
        assert all(
            isinstance(r, streamsub.BackendError) and "unexpected error" in str(r) for r in failed
        ), failed
        async with asyncio.timeout(10):
            after = await asyncio.gather(
                *(client.publish("packing", b"after-%d" % i) for i in range(30))
            )
        gate = client._publish_gate
        await until(lambda: gate.outstanding == (0, 0), 10, "every write's room back")
    ids = _ids(results) + list(after)
    assert len(ids) == len(set(ids)) == 50
    assert _stored(redis_client, "packing", 4) >= set(ids)
    assert len(_stored(redis_client, "packing", 4)) == 51  # and the warm-up
