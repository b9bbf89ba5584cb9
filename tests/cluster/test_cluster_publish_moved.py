"""A slot that moved while several writes to it were in flight (README, Redis
Cluster, Publishing: order is kept across a slot's move). The first write to
come back ``MOVED`` teaches the appender the slot's new master. No write, new
or sent again, may reach the new master before an earlier write still on its
way back from the old one: its link (append.lua) would find the write it
follows not stored, and fail a publish that nothing was wrong with (CI, stop
22: two held migrations under traffic, ``BROKENLINK write 1539 ... follows
write 1536``). Here the earlier write's answers are handled late because its
other partition waits on a third master that holds writes (CLIENT PAUSE)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import pytest

import streamsub
from streamsub._backends.base import BrokenLinkError, Link, TopicRecord
from streamsub._backends.redis import _keys
from streamsub._core.codec import encode
from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import owner_port, partition_slot, partition_tags, slot_held_migrating

PARTITIONS = 12
PAUSE = 2.0
"""Seconds the third master holds its scripts (``CLIENT PAUSE ... WRITE``: the
cluster bus goes on, so no failover): the earlier write's other partition
waits there, so its answer from the old master is handled late."""


def _packed(data: bytes) -> bytes:
    return encode(data, max_bytes=1024).packed


class _Moved(NamedTuple):
    backend: Any
    topic: TopicRecord
    a: int
    """The partition whose slot moved."""
    b: int
    """A partition on the third master, kept busy."""
    slot: int
    source: str
    target: int


@contextlib.asynccontextmanager
async def _moved(cluster: RedisClusterServers) -> AsyncIterator[_Moved]:
    """A topic whose partition A's slot moved to another master after the
    appender wrote there (its map still names the old one), with the master of
    partition B (neither of the two) holding writes for PAUSE seconds."""
    async with streamsub.connect(cluster.url) as client:
        await client.create_topic("moved", partitions=PARTITIONS)
        backend = client._backend
        topic = await backend.get_topic("moved")
        assert topic is not None
        a, slot = 0, partition_slot(cluster, "moved", 0)
        source = owner_port(cluster, slot)
        target = next(p for p in cluster.master_ports() if p != source)  # slot_held_migrating's
        third = next(p for p in cluster.master_ports() if p not in (source, target))
        b = next(
            p
            for p in range(PARTITIONS)
            if owner_port(cluster, partition_slot(cluster, "moved", p)) == third
        )
        # The appender learns where both partitions are.
        await backend.append(topic, {a: _packed(b"w"), b: _packed(b"w")})
        with slot_held_migrating(cluster, slot):
            pass  # moved, and handed over on every master
        paused = cluster.node(third)
        try:
            paused.execute_command("CLIENT", "PAUSE", int(PAUSE * 1000), "WRITE")
            yield _Moved(backend, topic, a, b, slot, f"127.0.0.1:{source}", target)
        finally:
            paused.execute_command("CLIENT", "UNPAUSE")
            paused.close()
        assert backend._appender._order.in_flight() == []  # nothing left behind


def _stored(cluster: RedisClusterServers, port: int, partition: int) -> list[bytes]:
    inspect = cluster.node(port)
    try:
        stream = _keys.stream_key(partition_tags(cluster, "moved")[partition])
        return [fields[b"d"] for _, fields in inspect.xrange(stream)]
    finally:
        inspect.close()


def _assert_stored(*results: dict[int, list[str] | Exception]) -> None:
    for result in results:
        for outcome in result.values():
            assert not isinstance(outcome, BrokenLinkError | Exception), outcome


@pytest.mark.timeout(60)
async def test_a_new_write_waits_for_the_earlier_writes_on_their_way_back(
    emptied: RedisClusterServers,
) -> None:
    """Write X (A) and write Y (B, then A) are sent to A's old master together;
    X comes back MOVED and is stored on the new master, which the map names
    from then on, while Y's answer for A is still to be handled. Write Z (A,
    linked after Y) starts then: it must land after Y. Every write is stored,
    and partition A holds x, y, z in that order."""
    async with _moved(emptied) as moved:
        backend, topic, a, b = moved.backend, moved.topic, moved.a, moved.b
        x = asyncio.create_task(backend.append(topic, {a: _packed(b"x")}, {a: Link("w", 1, None)}))
        y = asyncio.create_task(
            backend.append(
                topic,
                {b: _packed(b"y"), a: _packed(b"y")},
                {b: Link("w", 2, None), a: Link("w", 2, 1)},
            )
        )
        x_result = await x
        # Y's write to A is still out at the old master: Z has to wait for it.
        stream = _keys.stream_key(partition_tags(emptied, "moved")[a])
        assert backend._appender._order.in_flight(stream) == [(moved.source, None, False)]
        z_result = await backend.append(topic, {a: _packed(b"z")}, {a: Link("w", 3, 2)})
        y_result = await y
        _assert_stored(x_result, y_result, z_result)
        assert _stored(emptied, moved.target, a) == [b"w", b"x", b"y", b"z"]


@pytest.mark.timeout(60)
async def test_a_write_sent_again_waits_for_the_earlier_writes_sent_again(
    emptied: RedisClusterServers,
) -> None:
    """Write Y (B, then A) and write Z (A, linked after Y) are both sent to A's
    old master and both come back MOVED. Z's answer is handled at once, Y's
    only once B's master answers: Z must be sent on after Y. Both are
    stored, and partition A holds y, z in that order."""
    async with _moved(emptied) as moved:
        backend, topic, a, b = moved.backend, moved.topic, moved.a, moved.b
        y = asyncio.create_task(
            backend.append(
                topic,
                {b: _packed(b"y"), a: _packed(b"y")},
                {b: Link("w", 1, None), a: Link("w", 1, None)},
            )
        )
        z = asyncio.create_task(backend.append(topic, {a: _packed(b"z")}, {a: Link("w", 2, 1)}))
        y_result, z_result = await asyncio.gather(y, z)
        _assert_stored(y_result, z_result)
        assert _stored(emptied, moved.target, a) == [b"w", b"y", b"z"]
