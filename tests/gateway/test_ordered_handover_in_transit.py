"""Gateway, ordered subscription: a partition is not handed over while entries
a pull took from it are on their way into the lease table.

A gateway hands a partition over once it holds no delivery of it and no read
of it is at the server. A pull's entries reach the lease table only after
the read returned, entry by entry, with a Redis call for each undecodable one
(nacked); meanwhile the partition counted as free: the newcomer took it over,
with those entries (pending under the old gateway's consumer), and both
gateways delivered the same message at once."""

from __future__ import annotations

import asyncio

import pytest
import redis

import streamsub
from streamsub._backends.redis import RedisBackend
from streamsub._core.partition import partition_for_key
from streamsub.gateway._adapter import Adapter, Puller, Received, SubscriptionView
from streamsub.testing import RedisServer
from tests._layout import stream_key
from tests._wait import until
from tests.conftest import ON_CLUSTER
from tests.ordered_faults._keys import ordered

FOREIGN = 6000


@pytest.mark.skipif(ON_CLUSTER, reason="builds standalone RedisBackends directly")
@pytest.mark.timeout(90)
async def test_entries_on_their_way_to_the_lease_table_hold_the_handover(
    client: streamsub.Client, server: RedisServer, redis_client: redis.Redis
) -> None:
    """Gateway a owns both partitions of an ordered subscription; partition 1
    holds 6,000 entries streamsub did not write, then message 0 of key k. Once
    a's pull has read them (and nacks the foreign ones one by one), gateway b
    joins: partition 1 is b's by right. Message 0 is delivered by one gateway
    only (before the fix: by b, which took partition 1 over while a's pull
    was still on its way, and then by a)."""
    await ordered(client, partitions=2)
    key = next(k for k in (f"k{i}" for i in range(200)) if partition_for_key(k, 2) == 1)
    stream = stream_key(redis_client, "orders", 1)
    pipe = redis_client.pipeline(transaction=False)
    for _ in range(FOREIGN):
        pipe.xadd(stream, {"foo": "bar"})
    pipe.execute()
    await client.publish("orders", b"k:0", ordering_key=key)

    a, b = (
        Adapter(RedisBackend(server.url), ownership_lease=1.5),
        Adapter(RedisBackend(server.url), ownership_lease=1.5),
    )

    def stream_puller(adapter: Adapter, view: SubscriptionView) -> Puller:
        return adapter.puller(
            view,
            consumer=adapter.new_consumer("stream"),
            max_messages=20_000,
            max_bytes=10**12,
            deadline=60.0,
            stream=True,
        )

    received: dict[str, list[Received]] = {"a": [], "b": []}
    stop = asyncio.Event()

    async def pulling(name: str, puller: Puller) -> None:
        while not stop.is_set():
            received[name] += await puller.pull(200)

    tasks: list[asyncio.Task[None]] = []
    try:
        first = stream_puller(a, await a.view("billing"))
        membership = a.membership("billing")
        assert membership is not None
        await until(lambda: set(membership.owned) == {0, 1}, 10, "a to own both partitions")
        tasks.append(asyncio.create_task(pulling("a", first)))
        await until(
            lambda: redis_client.xpending(stream, "billing")["pending"] == FOREIGN + 1,
            10,
            "a's pull to read partition 1",
        )
        second = stream_puller(b, await b.view("billing"))
        tasks.append(asyncio.create_task(pulling("b", second)))
        await until(lambda: received["a"] or received["b"], 20, "message 0 delivered")
        delivered = next(r for r in received["a"] + received["b"] if r.data == b"k:0")
        holder = "a" if delivered in received["a"] else "b"
        # Its delivery is still the holder's to settle: nobody took it over.
        settler = a if holder == "a" else b
        failed = await settler.acknowledge(await settler.view("billing"), [delivered.ack_id])
        # b then owns partition 1 and has swept it whole.
        theirs = b.membership("billing")
        assert theirs is not None
        await until(
            lambda: 1 in theirs.owned and not theirs.taking, 20, "b to own and sweep partition 1"
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await a.close()
        await b.close()
    copies = [n for n, got in received.items() for r in got if r.data == b"k:0"]
    assert copies == [holder], f"message 0 delivered by {copies}"
    assert failed == [], "the first delivery's ack settled nothing: it was taken over"
