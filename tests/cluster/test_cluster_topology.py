"""Topology changes under traffic on a real Redis Cluster: a partition's slot
moves to another master while messages are published and consumed."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator

import pytest

import streamsub
from streamsub._backends.redis import _keys
from streamsub.testing import RedisClusterServers
from tests._wait import until


@pytest.fixture
async def cluster_client(cluster: RedisClusterServers) -> AsyncIterator[streamsub.Client]:
    """A streamsub client on the emptied session cluster."""
    inspect = cluster.client()
    inspect.flushall()
    inspect.close()
    async with streamsub.connect(cluster.url) as client:
        yield client


def move_slot(cluster: RedisClusterServers, slot: int, pause: float) -> tuple[int, int]:
    """Move ``slot`` from its master to another, by hand as redis-cli --cluster
    reshard does (IMPORTING/MIGRATING, MIGRATE its keys, SETSLOT NODE everywhere),
    waiting ``pause`` seconds while it is migrating; return (from, to) ports."""
    inspect = cluster.client()
    try:
        source_port = inspect.nodes_manager.get_node_from_slot(slot).port
    finally:
        inspect.close()
    masters = cluster.master_ports()
    target_port = next(p for p in masters if p != source_port)
    source, target = cluster.node(source_port), cluster.node(target_port)
    others = [cluster.node(p) for p in masters if p not in (source_port, target_port)]
    try:
        source_id = source.execute_command("CLUSTER", "MYID").decode()
        target_id = target.execute_command("CLUSTER", "MYID").decode()
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        time.sleep(pause)
        while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *keys)
            time.sleep(pause)
        for node in (target, source, *others):
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    finally:
        for node in (source, target, *others):
            node.close()
    return source_port, target_port


async def test_a_partition_moving_to_another_master_loses_nothing_and_keeps_key_order(
    cluster: RedisClusterServers, cluster_client: streamsub.Client
) -> None:
    """While 6,000 keyed messages (60 keys) are published in overlapping batches
    and two subscribers consume, partition 0's slot migrates to another master:
    every publish returns an id, every message is delivered, each key's messages
    are stored in publish order, and nothing stays pending."""
    client = cluster_client
    await client.create_topic("moving", partitions=4)
    await client.create_subscription("moving-sub", topic="moving", ack_deadline=5.0)
    record = await client._backend.get_topic("moving")
    assert record is not None
    stream = _keys.stream_key(_keys.partition_tag("moving", 0, record.salts[0]))
    inspect = cluster.client()
    slot = inspect.keyslot(stream)
    inspect.close()

    seen: collections.Counter[str] = collections.Counter()

    async def handler(message: streamsub.Message) -> None:
        seen[message.message_id] += 1

    ids: list[str] = []
    total, keys = 6000, 60

    async def publish() -> None:
        for start in range(0, total, 300):
            calls = [
                client.publish("moving", f"{i}".encode(), ordering_key=f"k{i % keys}")
                for i in range(start, start + 300)
            ]
            ids.extend(await asyncio.gather(*calls))
            await asyncio.sleep(0.02)

    async with (
        client.subscribe("moving-sub", handler, consumer="a"),
        client.subscribe("moving-sub", handler, consumer="b"),
    ):
        publisher = asyncio.create_task(publish())
        await until(lambda: len(ids) >= total // 4, 30, "a quarter published")
        source, target = await asyncio.to_thread(move_slot, cluster, slot, 0.2)
        await publisher
        await until(lambda: set(seen) >= set(ids), 60, "every message delivered")
    assert len(ids) == total
    nodes = await client._backend.partition_nodes(record)  # type: ignore[attr-defined]
    assert nodes[0] == f"127.0.0.1:{target}" != f"127.0.0.1:{source}"
    inspect = cluster.client()
    try:
        order: dict[str, list[int]] = collections.defaultdict(list)
        for p in range(4):
            key = _keys.stream_key(_keys.partition_tag("moving", p, record.salts[p]))
            for _, fields in inspect.xrange(key):
                number = int(fields[b"d"]) if b"d" in fields else None
                assert number is not None
                order[f"k{number % keys}"].append(number)
            assert inspect.xpending(key, "moving-sub")["pending"] == 0
    finally:
        inspect.close()
    assert all(numbers == sorted(numbers) for numbers in order.values())
    assert sum(len(n) for n in order.values()) == total
