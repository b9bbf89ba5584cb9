"""Topics on a real Redis Cluster: partitions spread evenly over the masters,
each partition's keys in one slot, and topics of the older layout keep working."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import AsyncIterator

import pytest

import streamsub
from streamsub._backends.base import TopicRecord
from streamsub._backends.redis import RedisClusterBackend, _keys
from streamsub._backends.redis._slots import key_slot
from streamsub.testing import RedisClusterServers


@pytest.fixture
async def cluster_client(cluster: RedisClusterServers) -> AsyncIterator[streamsub.Client]:
    """A streamsub client on the emptied session cluster."""
    inspect = cluster.client()
    inspect.flushall()
    inspect.close()
    async with streamsub.connect(cluster.url) as client:
        yield client


async def test_sixteen_partitions_spread_five_or_six_on_each_of_three_masters(
    cluster: RedisClusterServers, cluster_client: streamsub.Client
) -> None:
    """A 16-partition topic has 5 or 6 partitions on each master, for several
    topics, and every key of a partition lives in its stream's slot."""
    backend = cluster_client._backend
    assert isinstance(backend, RedisClusterBackend)
    for name in ("orders", "billing", "audit-log", "t.1"):
        await cluster_client.create_topic(name, partitions=16)
        await cluster_client.create_subscription(f"{name}-sub", topic=name)
        record = await backend.get_topic(name)
        assert record is not None
        assert record.layout == _keys.CLUSTER_LAYOUT
        nodes = await backend.partition_nodes(record)
        counts = collections.Counter(nodes)
        assert sorted(counts) == [f"127.0.0.1:{p}" for p in cluster.master_ports()]
        assert sorted(counts.values()) == [5, 5, 6], (name, counts)
        inspect = cluster.client()
        try:
            for partition, salt in enumerate(record.salts):
                tag = _keys.partition_tag(name, partition, salt)
                stream = _keys.stream_key(tag)
                assert inspect.exists(stream)
                assert {
                    key_slot(key)
                    for key in (
                        stream,
                        _keys.delay_key(tag, f"{name}-sub"),
                        _keys.times_key(tag, f"{name}-sub"),
                        _keys.holds_key(tag),
                        _keys.dropped_key(tag),
                        _keys.claims_key(tag),
                        _keys.seek_key(tag, f"{name}-sub"),
                    )
                } == {inspect.keyslot(stream)}
        finally:
            inspect.close()


async def test_a_topic_of_the_plain_layout_keeps_its_keys_on_a_cluster(
    cluster: RedisClusterServers, cluster_client: streamsub.Client
) -> None:
    """A topic stored with layout v1 (no salts, as before this layout existed)
    keeps its ss:{<topic>.<n>} streams: 2,000 messages on 4 partitions reach two
    subscribers of its subscription, each once."""

    class PlainLayout(RedisClusterBackend):
        async def _layout(self, record: TopicRecord) -> TopicRecord:
            return dataclasses.replace(record, layout=_keys.LAYOUT, salts=())

    async with streamsub.Client(PlainLayout(cluster.url)) as old:
        await old.create_topic("legacy", partitions=4)
    inspect = cluster.client()
    try:
        assert all(inspect.exists(f"ss:{{legacy.{p}}}") for p in range(4))
    finally:
        inspect.close()
    await cluster_client.create_subscription("legacy-sub", topic="legacy")
    ids = await cluster_client.publish_many(
        "legacy",
        [streamsub.OutgoingMessage(data=b"m%d" % i, ordering_key=f"k{i}") for i in range(2000)],
    )
    seen: collections.Counter[str] = collections.Counter()
    done = asyncio.Event()

    async def handler(message: streamsub.Message) -> None:
        seen[message.message_id] += 1
        if len(seen) == len(ids):
            done.set()

    async with (
        cluster_client.subscribe("legacy-sub", handler, consumer="a"),
        cluster_client.subscribe("legacy-sub", handler, consumer="b"),
    ):
        await asyncio.wait_for(done.wait(), 30)
    assert set(seen) == set(ids)
    assert set(seen.values()) == {1}
