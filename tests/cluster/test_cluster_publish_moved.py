"""A slot that moved while several writes to it were in flight (README, Redis
Cluster, Publishing: order is kept across a slot's move). The first write to
come back ``MOVED`` teaches the appender the slot's new master; a write started
after that must not reach the new master before the earlier writes still on
their way back from the old one: its link (append.lua) would find the write it
follows not stored, and fail a publish that nothing was wrong with (CI, stop
22: two held migrations under traffic, ``BROKENLINK write 1539 ... follows
write 1536``)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import redis

import streamsub
from streamsub._backends.base import BrokenLinkError, Link
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


@pytest.mark.timeout(60)
async def test_a_write_after_a_moved_slot_waits_for_the_earlier_writes_on_their_way_back(
    emptied: RedisClusterServers,
) -> None:
    """Partition A's slot is moved to another master once the appender has
    written there. Write X (A) and write Y (B on a third master, then A) are
    sent to the old master together; X comes back MOVED and is sent to the new
    master, while Y's answers wait behind a busy script on B's master. Write Z
    (A, linked after Y) starts once X is stored. Z must land after Y: every
    write is stored, and partition A holds x, y, z in that order."""
    cluster = emptied
    async with streamsub.connect(cluster.url) as client:
        await client.create_topic("moved", partitions=PARTITIONS)
        backend = client._backend
        topic = await backend.get_topic("moved")
        assert topic is not None
        masters = cluster.master_ports()
        owners = [owner_port(cluster, partition_slot(cluster, "moved", p)) for p in range(2)]
        a = 0
        source = owners[0]
        target = next(p for p in masters if p != source)  # slot_held_migrating's choice
        third = next(p for p in masters if p not in (source, target))
        b = next(
            p
            for p in range(PARTITIONS)
            if owner_port(cluster, partition_slot(cluster, "moved", p)) == third
        )
        # The appender learns where both partitions are.
        await backend.append(topic, {a: _packed(b"w"), b: _packed(b"w")})
        with slot_held_migrating(cluster, partition_slot(cluster, "moved", a)):
            pass  # moved, and handed over on every master
        busy = await asyncio.to_thread(_hold_busy, cluster, third)
        try:
            x = asyncio.create_task(
                backend.append(topic, {a: _packed(b"x")}, {a: Link("w", 1, None)})
            )
            y = asyncio.create_task(
                backend.append(
                    topic,
                    {b: _packed(b"y"), a: _packed(b"y")},
                    {b: Link("w", 2, None), a: Link("w", 2, 1)},
                )
            )
            x_result = await x
            assert not y.done(), "the busy master answered early: the test proves nothing"
            z_result = await backend.append(topic, {a: _packed(b"z")}, {a: Link("w", 3, 2)})
            y_result = await y
        finally:
            busy.close()
    for result in (x_result[a], y_result[a], y_result[b], z_result[a]):
        assert not isinstance(result, BrokenLinkError | Exception), result
    inspect = cluster.node(target)
    try:
        stream = _keys.stream_key(partition_tags(cluster, "moved")[a])
        stored = [fields[b"d"] for _, fields in inspect.xrange(stream)]
    finally:
        inspect.close()
    assert stored == [b"w", b"x", b"y", b"z"]
