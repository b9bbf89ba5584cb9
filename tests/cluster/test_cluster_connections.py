"""The cluster client's connection cap per node: a command beyond it waits for a
free connection (as on one server) instead of failing "Too many connections"."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Iterator

import redis

import streamsub
from streamsub._backends.redis import RedisClusterBackend
from streamsub.testing import RedisClusterServers
from tests._wait import until


@contextlib.contextmanager
def most_connections(cluster: RedisClusterServers) -> Iterator[collections.Counter[int]]:
    """Per master port, the most connections of other clients seen at once, over
    and above those there before (sampled every 5 ms in a thread meanwhile)."""
    nodes: dict[int, redis.Redis] = {p: cluster.node(p) for p in cluster.master_ports()}

    def clients() -> dict[int, int]:
        return {p: int(n.info("clients")["connected_clients"]) for p, n in nodes.items()}

    before = clients()
    peak: collections.Counter[int] = collections.Counter()
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            for port, count in clients().items():
                peak[port] = max(peak[port], count - before[port])

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        for node in nodes.values():
            node.close()


async def test_commands_beyond_the_cap_on_one_node_wait_and_all_succeed(
    emptied: RedisClusterServers,
) -> None:
    """With 2 connections per node, 200 concurrent lookups of one topic (one
    key: one node) all answer, and no node serves more than 2 pooled
    connections of the client (plus its in-order publishing one) meanwhile."""
    with most_connections(emptied) as peak:
        backend = RedisClusterBackend(emptied.url, max_connections=2)
        async with streamsub.Client(backend) as client:
            await client.create_topic("capped", partitions=4)
            for _ in range(5):
                topics = await asyncio.gather(*(client.get_topic("capped") for _ in range(200)))
                assert {t.partitions for t in topics} == {4}
    assert peak, "no sample taken"
    assert max(peak.values()) <= 4, peak


async def test_subscribers_and_publishers_beyond_the_cap_deliver_everything(
    emptied: RedisClusterServers,
) -> None:
    """With 2 connections per node, four subscribers of one client and eight
    concurrent publishers move 4,000 messages over 6 partitions: every message
    is delivered, none twice, and no node serves more than 2 pooled
    connections of the client plus its in-order publishing one and its
    wake-up listener's pub/sub one."""
    seen: collections.Counter[bytes] = collections.Counter()

    async def handler(message: streamsub.Message) -> None:
        seen[message.data] += 1
        await asyncio.sleep(0)

    with most_connections(emptied) as peak:
        backend = RedisClusterBackend(emptied.url, max_connections=2)
        async with streamsub.Client(backend) as client:
            await client.create_topic("capped", partitions=6)
            await client.create_subscription("capped-sub", topic="capped")
            subscribers = [client.subscribe("capped-sub", handler) for _ in range(4)]
            for subscriber in subscribers:
                await subscriber.__aenter__()
            try:
                await asyncio.gather(
                    *(
                        client.publish_many("capped", [b"%d-%d" % (w, i) for i in range(500)])
                        for w in range(8)
                    )
                )
                await until(lambda: len(seen) == 4000, 60, "every message delivered")
            finally:
                for subscriber in subscribers:
                    await subscriber.__aexit__(None, None, None)
    assert max(seen.values()) == 1
    assert max(peak.values()) <= 4, peak
