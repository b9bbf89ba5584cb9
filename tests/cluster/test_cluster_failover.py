"""Publish durability and a failover under traffic, on a real Redis Cluster."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import pytest

import streamsub
from streamsub._backends.redis import _keys
from streamsub.testing import RedisClusterServers
from tests._wait import until


async def test_durability_waits_for_replicas_and_fails_when_too_few_confirm(
    emptied: RedisClusterServers,
) -> None:
    """With one replica per master, Durability(replicas=1) publishes 2,000
    messages over 6 partitions normally, while replicas=2 raises
    UnavailableError after its timeout, saying the batch is stored but not
    confirmed."""
    url = emptied.url
    async with streamsub.connect(url, durability=streamsub.Durability(replicas=1)) as client:
        await client.create_topic("durable", partitions=6)
        ids = await client.publish_many("durable", [b"m%d" % i for i in range(2000)])
        assert len(set(ids)) == 2000
    too_many = streamsub.Durability(replicas=2, timeout=0.3)
    async with streamsub.connect(url, durability=too_many) as client:
        started = time.monotonic()
        with pytest.raises(streamsub.UnavailableError, match="only 1 of the 2 replicas"):
            await client.publish("durable", b"unconfirmed")
        assert time.monotonic() - started >= 0.3


def test_durability_timeout_must_stay_below_the_socket_timeout() -> None:
    """A WAIT longer than the socket timeout would count as a dead connection:
    refused up front, as are ill-formed settings."""
    with pytest.raises(streamsub.InvalidArgumentError, match="below the socket timeout"):
        streamsub.connect(
            "redis://127.0.0.1:1/0",
            socket_timeout=2.0,
            durability=streamsub.Durability(replicas=1, timeout=5.0),
        )
    with pytest.raises(streamsub.InvalidArgumentError):
        streamsub.Durability(replicas=-1)
    with pytest.raises(streamsub.InvalidArgumentError):
        streamsub.Durability(replicas=1, timeout=0)


def failover(cluster: RedisClusterServers, slot: int) -> tuple[int, int]:
    """CLUSTER FAILOVER on the replica of ``slot``'s master; wait until the
    cluster agrees; return (old master, new master) ports."""
    inspect = cluster.client()
    try:
        old = inspect.nodes_manager.get_node_from_slot(slot).port
    finally:
        inspect.close()
    for port in cluster.ports:
        node = cluster.node(port)
        try:
            info = node.info("replication")
            if info.get("role") == "slave" and int(info["master_port"]) == old:
                node.execute_command("CLUSTER", "FAILOVER")
                new = port
                break
        finally:
            node.close()
    deadline = time.monotonic() + 15
    while new not in cluster.master_ports() and time.monotonic() < deadline:
        time.sleep(0.05)
    cluster.wait_ready()
    return old, new


def kill_master(cluster: RedisClusterServers, slot: int) -> tuple[int, int]:
    """SIGKILL ``slot``'s master; wait until its replica took over; start the
    killed one again (it comes back as a replica) and wait until the cluster is
    whole; return (old master, new master) ports."""
    inspect = cluster.client()
    try:
        old = inspect.nodes_manager.get_node_from_slot(slot).port
    finally:
        inspect.close()
    before = set(cluster.master_ports())
    server = next(s for s in cluster.servers if s.port == old)
    server.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        masters = [p for p in cluster.master_ports() if p != old]
        if len(masters) == cluster.masters:
            break
        time.sleep(0.05)
    new = next(p for p in cluster.master_ports() if p != old and p not in before)
    server.start()
    cluster.wait_ready()
    return old, new


async def run_through(
    cluster: RedisClusterServers,
    topic: str,
    fail: Callable[[RedisClusterServers, int], tuple[int, int]],
) -> None:
    """20,000 keyed messages published in overlapping batches with
    Durability(replicas=1) while two subscribers consume; ``fail`` strikes the
    master of partition 0 a quarter of the way in. Every message whose publish
    returned an id is delivered, at least half were published, and none stays
    pending."""
    durability = streamsub.Durability(replicas=1)
    async with streamsub.connect(cluster.url, durability=durability) as client:
        await client.create_topic(topic, partitions=8)
        await client.create_subscription(f"{topic}-sub", topic=topic, ack_deadline=5.0)
        record = await client._backend.get_topic(topic)
        assert record is not None
        tags = [_keys.partition_tag(topic, p, s) for p, s in enumerate(record.salts)]
        inspect = cluster.client()
        slot = inspect.keyslot(_keys.stream_key(tags[0]))
        inspect.close()

        seen: collections.Counter[str] = collections.Counter()

        async def handler(message: streamsub.Message) -> None:
            seen[message.message_id] += 1

        ids: list[str] = []
        failed = 0
        total = 20_000

        async def publish() -> None:
            nonlocal failed
            for start in range(0, total, 500):
                calls = [
                    client.publish(topic, b"%d" % i, ordering_key=f"k{i % 100}")
                    for i in range(start, start + 500)
                ]
                for result in await asyncio.gather(*calls, return_exceptions=True):
                    if isinstance(result, str):
                        ids.append(result)
                    elif isinstance(
                        result, streamsub.OrderingKeyPausedError | streamsub.UnavailableError
                    ):
                        failed += 1
                    else:
                        raise result
                for key in range(100):
                    client.resume_publish(topic, f"k{key}")

        async with (
            client.subscribe(f"{topic}-sub", handler, consumer="a"),
            client.subscribe(f"{topic}-sub", handler, consumer="b"),
        ):
            publisher = asyncio.create_task(publish())
            await until(lambda: len(ids) >= total // 4, 60, "a quarter published")
            old, new = await asyncio.to_thread(fail, cluster, slot)
            await publisher
            await until(lambda: set(seen) >= set(ids), 90, "every published message delivered")
    assert old != new
    assert len(ids) + failed == total
    assert len(ids) >= total // 2
    inspect = cluster.client()
    try:
        for tag in tags:
            assert inspect.xpending(_keys.stream_key(tag), f"{topic}-sub")["pending"] == 0
    finally:
        inspect.close()


async def test_a_manual_failover_under_traffic_loses_no_published_message(
    emptied: RedisClusterServers,
) -> None:
    """CLUSTER FAILOVER on the replica of partition 0's master during a
    20,000-message run with Durability(replicas=1): nothing whose publish
    returned an id is lost (see run_through)."""
    await run_through(emptied, "failing", failover)


async def test_a_killed_master_under_traffic_loses_no_published_message(
    emptied: RedisClusterServers,
) -> None:
    """SIGKILL of partition 0's master during a 20,000-message run with
    Durability(replicas=1): its replica takes over, and nothing whose publish
    returned an id is lost (see run_through)."""
    await run_through(emptied, "killed", kill_master)
