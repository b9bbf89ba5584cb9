"""Reading through a cluster's traps (issue 9, "What to build 3": a read
answered CLUSTERDOWN, or a closed socket, is retried, not surfaced). No test in
other test provokes either on purpose while subscribers read."""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import pytest

import streamsub
from streamsub._backends.redis import _keys
from streamsub.testing import RedisClusterServers
from tests._wait import until
from tests.cluster._helpers import (
    assert_nothing_pending,
    owner_port,
    partition_slot,
    replica_port,
)


def _kill_clients(cluster: RedisClusterServers, rounds: int) -> int:
    """CLIENT KILL TYPE normal on every master, ``rounds`` times 0.3 s apart
    (the inspecting connection survives: SKIPME yes); the number killed."""
    killed = 0
    for _ in range(rounds):
        for port in cluster.master_ports():
            node = cluster.node(port)
            try:
                killed += int(node.execute_command("CLIENT", "KILL", "TYPE", "normal"))
            finally:
                node.close()
        time.sleep(0.3)
    return killed


def _slot_down(cluster: RedisClusterServers, slot: int, seconds: float) -> None:
    """Make ``slot``'s master drop the slot (its cluster state fails: it answers
    CLUSTERDOWN), then take it back ``seconds`` later.

    Its replica drops the slot too. After its master dropped a slot and took it
    back, Redis 7.0.15's replica agrees with every other node in ``CLUSTER
    NODES``, yet once it is promoted and the old master rejoins as its replica it
    unassigns that slot ("Cluster state changed: fail" in its log as the old
    master rejoins): the session cluster stayed down for every test after (seen
    in CI at the SIGKILL failover of test_cluster_wakeups). A replica that
    dropped the slot itself learns it again from the master's claim, and that
    failover goes through."""
    master = owner_port(cluster, slot)
    node = cluster.node(master)
    replica = cluster.node(replica_port(cluster, master))
    try:
        node.execute_command("CLUSTER", "DELSLOTS", slot)
        replica.execute_command("CLUSTER", "DELSLOTS", slot)
        deadline = time.monotonic() + 5
        while b"cluster_state:fail" not in node.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline, "the master kept serving"
            time.sleep(0.02)
        time.sleep(seconds)
        node.execute_command("CLUSTER", "ADDSLOTS", slot)
    finally:
        node.close()
        replica.close()
    cluster.wait_ready()


async def _consume_through(
    cluster: RedisClusterServers,
    topic: str,
    strike: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="streamsub")
    async with streamsub.connect(cluster.url) as client:
        await client.create_topic(topic, partitions=6)
        await client.create_subscription(f"{topic}-sub", topic=topic, ack_deadline=5.0)
        record = await client._backend.get_topic(topic)
        assert record is not None
        tags = [_keys.partition_tag(topic, p, s) for p, s in enumerate(record.salts)]
        slot = partition_slot(cluster, topic, 0)
        seen: collections.Counter[str] = collections.Counter()
        ids: list[str] = []
        stop = asyncio.Event()

        async def handler(message: streamsub.Message) -> None:
            seen[message.message_id] += 1

        async def publish() -> None:
            n = 0
            while not stop.is_set():
                calls = [
                    client.publish(topic, b"%d" % i, ordering_key=f"k{i % 50}")
                    for i in range(n, n + 100)
                ]
                n += 100
                for result in await asyncio.gather(*calls, return_exceptions=True):
                    if isinstance(result, str):
                        ids.append(result)
                for key in range(50):
                    client.resume_publish(topic, f"k{key}")
                await asyncio.sleep(0.01)

        async with (
            client.subscribe(f"{topic}-sub", handler, consumer="a"),
            client.subscribe(f"{topic}-sub", handler, consumer="b"),
        ):
            publisher = asyncio.create_task(publish())
            await until(lambda: len(seen) >= 1000, 30, "traffic flowing")
            if strike == "kill":
                assert await asyncio.to_thread(_kill_clients, cluster, 8) > 0
            else:
                await asyncio.to_thread(_slot_down, cluster, slot, 1.0)
            delivered_then = len(seen)
            await until(lambda: len(seen) >= delivered_then + 1000, 30, "delivery resumed")
            stop.set()
            await publisher
            await until(lambda: set(seen) >= set(ids), 60, "every published message delivered")
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.startswith("streamsub")
    ]
    assert errors == []
    assert_nothing_pending(cluster, tags, f"{topic}-sub")


@pytest.mark.timeout(120)
async def test_connections_closed_under_readers_are_retried_not_surfaced(
    emptied: RedisClusterServers, caplog: pytest.LogCaptureFixture
) -> None:
    """Every client connection of every master is closed 8 times, 0.3 s apart,
    while two subscribers read a 6-partition topic under publishing: delivery
    resumes, every message whose publish returned an id is delivered, nothing
    stays pending, and nothing is logged at ERROR by
    streamsub."""
    await _consume_through(emptied, "closed", "kill", caplog)


@pytest.mark.timeout(120)
async def test_clusterdown_under_readers_is_retried_not_surfaced(
    emptied: RedisClusterServers, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 0's master drops its slot for 1 s (it answers CLUSTERDOWN to
    everything) while two subscribers read a 6-partition topic under
    publishing: delivery resumes, every message whose publish returned an id is
    delivered, nothing stays pending, and nothing is logged at ERROR by
    streamsub."""
    await _consume_through(emptied, "down", "clusterdown", caplog)
