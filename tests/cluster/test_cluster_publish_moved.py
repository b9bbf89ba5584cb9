"""A slot that moved while several writes to it were in flight (README, Redis
Cluster, Publishing: order is kept across a slot's move). The first write to
come back ``MOVED`` teaches the appender the slot's new master. No write, new
or sent again, may reach the new master before an earlier write still on its
way back from the old one: its link (append.lua) would find the write it
follows not stored, and fail a publish that nothing was wrong with (CI, stop
22: two held migrations under traffic, ``BROKENLINK write 1539 ... follows
write 1536``). Here the earlier write's answers are handled late because its
other partition waits on a third master kept busy by a script."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import pytest
import redis

import streamsub
from streamsub._backends.base import BrokenLinkError, Link, TopicRecord
from streamsub._backends.redis import _keys
from streamsub._core.codec import encode
from streamsub.testing import RedisClusterServers
from tests.cluster._helpers import owner_port, partition_slot, partition_tags, slot_held_migrating

PARTITIONS = 12
BUSY = 1.0
"""Seconds a busy script holds the third master: the earlier write's other
partition waits there, so its answer from the old master is handled late."""

_BUSY_SCRIPT = """
local s = redis.call('TIME')
local start = s[1] * 1000000 + s[2]
while true do
  local t = redis.call('TIME')
  if t[1] * 1000000 + t[2] - start > tonumber(ARGV[1]) then return 1 end
end
"""


def _packed(data: bytes) -> bytes:
    return encode(data, max_bytes=1024).packed


def _hold_busy(cluster: RedisClusterServers, port: int) -> redis.Redis:
    """Start a script that keeps the master at ``port`` busy for BUSY seconds;
    return once it runs (a PING from another connection gets no answer)."""
    busy = cluster.node(port)
    busy.connection_pool.get_connection().send_command(  # its reply is not read
        "EVAL", _BUSY_SCRIPT, 0, int(BUSY * 1_000_000)
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        # A raw PING: redis-py would retry one that times out.
        with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
            probe.settimeout(0.05)
            probe.sendall(b"PING\r\n")
            try:
                probe.recv(16)
            except TimeoutError:
                return busy
        time.sleep(0.01)
    raise AssertionError("the busy script did not start")


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
    partition B (neither of the two) busy for BUSY seconds."""
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
        busy = await asyncio.to_thread(_hold_busy, cluster, third)
        try:
            yield _Moved(backend, topic, a, b, slot, f"127.0.0.1:{source}", target)
        finally:
            busy.close()
        assert backend._appender._order.in_flight(slot) == []  # nothing left behind


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
        assert backend._appender._order.in_flight(moved.slot) == [(moved.source, False, False)]
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
    only once B's busy master answers: Z must be sent on after Y. Both are
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
