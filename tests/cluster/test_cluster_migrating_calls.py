"""Lua calls (acks, lease extensions, nacks, reclaims) into a partition whose
slot is migrating, and calls that meet many MOVED replies in a row, on a real
Redis Cluster.

Two redis-py traps are behind these tests: on ``ASK`` it sends ``ASKING`` and
the command on two pooled connections, so with several free connections the
importing node redirects again and the call fails "TTL exhausted" for as long
as the migration lasts; and every fifth ``MOVED`` it closes every node's
connections, cutting calls in flight on nodes that did not move.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import streamsub
from streamsub._backends.base import NackItem, TopicRecord
from streamsub._backends.redis import _keys
from streamsub._backends.redis._cluster import RedisClusterBackend
from streamsub._backends.redis._slots import key_slot
from streamsub.testing import RedisClusterServers
from tests._wait import until
from tests.cluster._helpers import owner_port, partition_slot, slot_held_migrating, warm_pool

TOPIC, GROUP, PARTITIONS, MESSAGES = "migrating", "migrating-sub", 4, 200


@pytest.fixture
async def client(emptied: RedisClusterServers) -> AsyncIterator[streamsub.Client]:
    """A streamsub client on the emptied session cluster, with TOPIC and GROUP."""
    async with streamsub.connect(emptied.url) as connected:
        await connected.create_topic(TOPIC, partitions=PARTITIONS)
        await connected.create_subscription(GROUP, topic=TOPIC, ack_deadline=60.0)
        yield connected


def _backend(client: streamsub.Client) -> RedisClusterBackend:
    backend = client._backend
    assert isinstance(backend, RedisClusterBackend)
    return backend


async def _held(
    client: streamsub.Client, consumer: str
) -> tuple[TopicRecord, dict[int, list[str]]]:
    """Publish MESSAGES messages and read them all as ``consumer``: per partition,
    the ids it holds."""
    await asyncio.gather(
        *(client.publish(TOPIC, b"%d" % i, ordering_key=f"k{i}") for i in range(MESSAGES))
    )
    backend = _backend(client)
    record = await backend.get_topic(TOPIC)
    assert record is not None
    held: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    while sum(map(len, held.values())) < MESSAGES:
        entries = await backend.read(record, GROUP, consumer, range(PARTITIONS), 1000, None)
        assert entries, "messages missing"
        for entry in entries:
            held[entry.partition].append(entry.entry_id)
    assert all(len(ids) >= 20 for ids in held.values()), {p: len(i) for p, i in held.items()}
    return record, held


def _pending(cluster: RedisClusterServers, record: TopicRecord, partition: int) -> int:
    inspect = cluster.client()
    try:
        key = _keys.stream_key(_keys.partition_tag(TOPIC, partition, record.salts[partition]))
        return int(inspect.xpending(key, GROUP)["pending"])
    finally:
        inspect.close()


async def test_acks_extensions_nacks_and_reclaims_into_a_migrating_slot_succeed(
    emptied: RedisClusterServers, client: streamsub.Client
) -> None:
    """With partition 0's slot held MIGRATING (its keys already on the importing
    node) and several free pooled connections to both nodes, lease extensions,
    nacks, a reclaim and acks of all of partition 0's held messages succeed and
    take effect, and other partitions' acks in the same call are unaffected."""
    cluster = emptied
    backend = _backend(client)
    record, held = await _held(client, "c1")
    parked, ids0 = held[0][0], held[0][1:]
    others = {p: held[p] for p in range(1, PARTITIONS)}
    nacked, acked = ids0[: len(ids0) // 3], ids0[len(ids0) // 3 :]
    # One message nacked for an hour: the partition's delay set and delivery
    # times exist, so every key of its multi-key steps is there to move (keys
    # that exist nowhere, and keys not moved yet: below).
    hour = NackItem(parked, 3_600_000, int(time.time() * 1000), 1, True)
    assert (await backend.nack(record, GROUP, "c1", {0: [hour]}, 0))[0] == [parked]
    slot = partition_slot(cluster, TOPIC, 0)
    with slot_held_migrating(cluster, slot) as (source, target):
        await warm_pool(backend, source)
        await warm_pool(backend, target)
        asks_before = _errorstat(cluster, target, "ASK")  # the session's earlier tests'

        extended = await backend.extend(record, GROUP, "c1", {0: ids0})
        assert sorted(extended[0]) == sorted(ids0)

        now_ms = int(time.time() * 1000)
        items = [NackItem(i, 0, now_ms, 1, True) for i in nacked]
        given = await backend.nack(record, GROUP, "c1", {0: items}, 60_000)
        assert sorted(given[0]) == sorted(nacked)

        reclaimed, _ = await backend.reclaim(record, GROUP, "c2", {0: "-"}, 60_000, 1000, 0)
        assert sorted(r.entry.entry_id for r in reclaimed) == sorted(nacked)  # came back

        assert await backend.ack(record, GROUP, {0: acked}) == len(acked)
        both = {0: [*nacked, parked], **others}
        expected = len(nacked) + 1 + sum(map(len, others.values()))
        assert await backend.ack(record, GROUP, both) == expected
        assert _errorstat(cluster, target, "ASK") == asks_before  # no ASKING went astray
    assert owner_port(cluster, slot) == target
    assert [_pending(cluster, record, p) for p in range(PARTITIONS)] == [0] * PARTITIONS


def _errorstat(cluster: RedisClusterServers, port: int, error: str) -> int:
    """How many ``error`` replies the node at ``port`` sent (INFO errorstats)."""
    node = cluster.node(port)
    try:
        stat = node.info("errorstats").get(f"errorstat_{error}")
        if not stat:
            return 0
        # redis-py 6+ parses "count=3" into a dict; 5.0 leaves the text.
        return int(stat["count"] if isinstance(stat, dict) else str(stat).split("=")[1])
    finally:
        node.close()


def _asking(port: int, cluster: RedisClusterServers, *command: Any) -> Any:
    """``command``'s reply from the node at ``port``, behind ASKING on one connection."""
    node = cluster.node(port)
    try:
        pipe = node.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.execute_command(*command)
        return pipe.execute()[1]
    finally:
        node.close()


def _tryagains(cluster: RedisClusterServers, *ports: int) -> int:
    return sum(_errorstat(cluster, port, "TRYAGAIN") for port in ports)


async def test_steps_naming_keys_that_exist_nowhere_run_while_the_slot_is_held_migrating(
    emptied: RedisClusterServers, client: streamsub.Client
) -> None:
    """With partition 0's slot held MIGRATING, all its keys on the importing node
    and neither its delay set nor its delivery-time records existing anywhere,
    nacks for an hour (which make the delay set) and acks (which name the
    records) of partition 0, in calls with partition 1's, take effect on the
    importing node before the slot is handed over, though the importing node
    answers TRYAGAIN to steps declaring those keys."""
    cluster = emptied
    backend = _backend(client)
    record, held = await _held(client, "c1")
    parked, acked = held[0][:5], held[0][5:]
    tags = _keys.partition_tag(TOPIC, 0, record.salts[0])
    stream, delays = _keys.stream_key(tags), _keys.delay_key(tags, GROUP)
    times = _keys.times_key(tags, GROUP)
    inspect = cluster.client()
    try:
        assert inspect.exists(delays, times) == 0
    finally:
        inspect.close()
    slot = partition_slot(cluster, TOPIC, 0)
    with slot_held_migrating(cluster, slot) as (source, target):
        tried = _tryagains(cluster, source, target)
        now_ms = int(time.time() * 1000)
        hour = [NackItem(i, 3_600_000, now_ms, 1, True) for i in parked]
        given = await backend.nack(record, GROUP, "c1", {0: hour, 1: []}, 60_000)
        assert sorted(given[0]) == sorted(parked)
        assert int(_asking(target, cluster, "ZCARD", delays)) == len(parked)
        assert await backend.ack(record, GROUP, {0: acked, 1: held[1]}) == len(acked) + len(held[1])
        pending = _asking(target, cluster, "XPENDING", stream, GROUP)
        assert int(pending["pending"]) == len(parked)  # the parked ones only
        assert _tryagains(cluster, source, target) > tried  # the fallback was needed
        assert owner_port(cluster, slot) == source  # all of it before the handover
    assert _pending(cluster, record, 0) == len(parked)
    assert _pending(cluster, record, 1) == 0


async def test_a_step_naming_a_key_still_on_the_source_waits_for_it(
    emptied: RedisClusterServers, client: streamsub.Client
) -> None:
    """While partition 0's slot is held MIGRATING with only its stream moved and
    its delivery-time records still on the source, an ack that names those
    records does not run (neither node can run it): held past the retries it
    fails with UnavailableError saying the slot is migrating, and another waits,
    then takes effect, records included, once the records have moved and the
    slot is handed over."""
    cluster = emptied
    backend = _backend(client)
    record, held = await _held(client, "c1")
    ids0 = held[0]
    redelivered = ids0[:3]
    now_ms = int(time.time() * 1000)
    again = [NackItem(i, 0, now_ms, 1, True) for i in redelivered]
    assert sorted((await backend.nack(record, GROUP, "c1", {0: again}, 60_000))[0]) == sorted(
        redelivered
    )
    tags = _keys.partition_tag(TOPIC, 0, record.salts[0])
    stream, times = _keys.stream_key(tags), _keys.times_key(tags, GROUP)
    slot = partition_slot(cluster, TOPIC, 0)
    with slot_held_migrating(cluster, slot, only=[stream]) as (source, target):
        with pytest.raises(streamsub.UnavailableError, match="migrating") as raised:
            await backend.ack(record, GROUP, {0: ids0[:5]}, {0: redelivered})
        assert "TTL exhausted" not in str(raised.value)
        tried = _tryagains(cluster, source, target)
        waiting = asyncio.create_task(backend.ack(record, GROUP, {0: ids0}, {0: redelivered}))
        await until(lambda: _tryagains(cluster, source, target) > tried, 10, "a TRYAGAIN")
        assert not waiting.done()
        node = cluster.node(source)
        try:
            assert sorted(node.hkeys(times)) == sorted(i.encode() for i in redelivered)
        finally:
            node.close()
        assert int(_asking(target, cluster, "XPENDING", stream, GROUP)["pending"]) == len(ids0)
    assert await waiting == len(ids0)
    assert _pending(cluster, record, 0) == 0
    inspect = cluster.client()
    try:
        assert inspect.exists(times) == 0
    finally:
        inspect.close()


def _ranges(cluster: RedisClusterServers, port: int | None = None) -> list[tuple[int, int, int]]:
    """(first slot, last slot, master's port) as the master at ``port`` sees them."""
    node = cluster.node(port or cluster.master_ports()[0])
    try:
        ranges = node.execute_command("CLUSTER", "SLOTS")
        return [(first, last, int(port)) for first, last, (_, port, *_), *_ in ranges]
    finally:
        node.close()


def _sockets(node: Any) -> list[tuple[int, Any]]:
    """Each connection of a redis-py cluster node: its identity and its socket's
    local address (None when closed)."""
    return [
        (id(c), c._writer.get_extra_info("sockname") if c.is_connected else None)
        for c in node._connections
    ]


def _settled(cluster: RedisClusterServers, slot: int) -> int:
    """Wait until every master names the same owner of ``slot``; its port."""
    deadline = time.monotonic() + 10
    while True:
        owners = {
            port
            for master in cluster.master_ports()
            for first, last, port in _ranges(cluster, master)
            if first <= slot <= last
        }
        if len(owners) == 1:
            return owners.pop()
        assert time.monotonic() < deadline, f"the masters disagree on slot {slot}: {owners}"
        time.sleep(0.01)


def _move(cluster: RedisClusterServers, slot: int) -> None:
    """Move ``slot`` to another master once every master agrees on its owner,
    and wait until they all name the new one (the new owner's config epoch
    made the highest, so that quick moves back and forth settle)."""
    _settled(cluster, slot)
    with slot_held_migrating(cluster, slot) as (_, target):
        pass
    node = cluster.node(target)
    try:
        node.execute_command("CLUSTER", "BUMPEPOCH")
    finally:
        node.close()
    assert _settled(cluster, slot) == target


async def test_many_moved_replies_in_a_row_leave_other_nodes_connections_alone(
    emptied: RedisClusterServers, client: streamsub.Client
) -> None:
    """Partition 0's slot moves to another master; then, twelve times, the
    client's slot map names the old master again (as a client's map is stale
    after each move) and an ack into the slot gets a MOVED reply: every ack
    succeeds, and a blocking read in flight on the third master is not cut
    (redis-py alone closes every node's connections every fifth MOVED, and
    resends the read), nor are that master's pooled connections closed."""
    cluster = emptied
    backend = _backend(client)
    record, held = await _held(client, "c1")
    slot = partition_slot(cluster, TOPIC, 0)
    before = owner_port(cluster, slot)
    _move(cluster, slot)
    first = owner_port(cluster, slot)
    assert first != before
    second = next(p for p in cluster.master_ports() if p != first)
    third = next(p for p in cluster.master_ports() if p not in (first, second))
    probe = next(
        f"probe-{i}"
        for i in range(10_000)
        for a, b, port in _ranges(cluster)
        if port == third and a <= key_slot(f"probe-{i}") <= b
    )
    redis_cluster = backend._redis
    await warm_pool(backend, third)
    third_node = redis_cluster.get_node(host="127.0.0.1", port=third)

    blocked = asyncio.create_task(
        redis_cluster.execute_command("XREAD", "BLOCK", 8_000, "STREAMS", probe, "$")
    )
    watcher = cluster.node(third)
    try:

        def blocked_there() -> bool:
            return int(watcher.info("clients")["blocked_clients"]) > 0

        await until(blocked_there, 10, "the XREAD blocked on the third master")
        sockets = _sockets(third_node)
        assert len(sockets) > 1  # the blocked read's and the pool's
        ids = held[0]
        moves = 12
        stale = redis_cluster.get_node(host="127.0.0.1", port=before)
        moved_before = _errorstat(cluster, before, "MOVED")
        for n in range(moves):
            redis_cluster.nodes_manager.slots_cache[slot] = [stale]  # the map before the move
            assert await backend.ack(record, GROUP, {0: ids[n::moves]}) == len(ids[n::moves])
        assert not blocked.done(), blocked
        writer = cluster.client()
        try:
            writer.xadd(probe, {"x": "1"})
        finally:
            writer.close()
        reply = await asyncio.wait_for(blocked, 10)
        assert reply, reply
        assert reply[0][1], reply
        # The blocked read and the pooled connections to the third master are
        # the same connections on the same sockets: none was cut.
        assert _sockets(third_node)[: len(sockets)] == sockets
        assert _errorstat(cluster, before, "MOVED") - moved_before == moves  # one each
    finally:
        if not blocked.done():
            blocked.cancel()
        watcher.close()
    assert _pending(cluster, record, 0) == 0
