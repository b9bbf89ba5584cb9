"""Ack, lease extension and nack of a partition whose slot is migrating.

While ``redis-cli --cluster reshard`` moves a slot, between its MIGRATE calls and
its final ``SETSLOT NODE`` the source answers ``ASK`` for every key already
moved. redis-py's cluster client follows an ASK by sending ``ASKING`` and the
command as two separate calls on the node, each taking a pooled connection; the
pool hands out connections first-in first-out, so with two or more free
connections the command goes out on a connection that did not get ``ASKING``,
is answered ``MOVED`` back to the source, which answers ``ASK`` again ... until
"TTL exhausted". Issue 9, point 3 names exactly this trap; the appender works
around it, the Lua calls of subscribers (ack, extend, nack) do not: they fail
for as long as the slot migrates, every retry, and a large slot migrates for
a long time.
"""

from __future__ import annotations

import pytest

import streamsub
from streamsub._backends.base import NackItem
from streamsub.testing import RedisClusterServers
from tests.review9._helpers import emptied, partition_slot, slot_held_migrating, warm_pool


async def _pending(client: streamsub.Client, topic: str, sub: str) -> tuple[object, list[str]]:
    backend = client._backend  # type: ignore[attr-defined]
    record = await backend.get_topic(topic)
    entries = await backend.read(record, sub, "c1", [0], 10, None)
    assert entries, "nothing read"
    return record, [e.entry_id for e in entries]


@pytest.mark.parametrize("call", ["ack", "extend", "nack"])
async def test_subscriber_lua_calls_succeed_while_their_slot_migrates(
    cluster: RedisClusterServers, call: str
) -> None:
    """Every message of the partition is on the target (slot IMPORTING there,
    MIGRATING on the source), as during a reshard. An ack / lease extension /
    nack of a delivered message must succeed (the README: MOVED/ASK "which
    redis-py follows"; the issue: writes into a migrating slot must not fail
    with "TTL exhausted"). It fails, for as long as the slot migrates."""
    emptied(cluster)
    async with streamsub.connect(cluster.url) as client:
        await client.create_topic("mig", partitions=1)
        await client.create_subscription("mig-sub", topic="mig")
        for i in range(5):
            await client.publish("mig", f"m{i}".encode())
        record, ids = await _pending(client, "mig", "mig-sub")
        backend = client._backend  # type: ignore[attr-defined]
        slot = partition_slot(cluster, "mig", 0)
        with slot_held_migrating(cluster, slot) as (_, target):
            await warm_pool(backend, target)
            failures = []
            for _ in range(3):  # a subscriber retries with backoff: every retry fails
                try:
                    if call == "ack":
                        await backend.ack(record, "mig-sub", {0: ids[:1]})
                    elif call == "read":
                        await client.publish("mig", b"late")  # the appender follows ASK
                        got = await backend.read(record, "mig-sub", "c1", [0], 10, 500)
                        assert got or failures, "the message published meanwhile was not read"
                    elif call == "extend":
                        await backend.extend(record, "mig-sub", "c1", {0: ids})
                    else:
                        await backend.nack(
                            record, "mig-sub", "c1",
                            {0: [NackItem(ids[-1], 0, 0, 1, True)]}, 1000,
                        )  # fmt: skip
                except streamsub.StreamsubError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
            assert failures == [], failures


async def test_an_ack_into_a_migrating_slot_does_not_cut_other_nodes_calls(
    cluster: RedisClusterServers,
) -> None:
    """README (Failures): a call that meets a moved slot "fails that one call".
    The issue names the trap: "several error paths close the whole client,
    cutting every node's ..." connections. An ack looping on ASK/MOVED makes
    redis-py close the whole client every fifth MOVED, and a call in flight on
    another master at that moment (here a 1.5 s command standing for any read,
    ack or lease extension of another subscriber) fails with it."""
    import asyncio

    emptied(cluster)
    async with streamsub.connect(cluster.url) as client:
        await client.create_topic("mig2", partitions=1)
        await client.create_subscription("mig2-sub", topic="mig2")
        for i in range(3):
            await client.publish("mig2", f"m{i}".encode())
        record, ids = await _pending(client, "mig2", "mig2-sub")
        backend = client._backend  # type: ignore[attr-defined]
        slot = partition_slot(cluster, "mig2", 0)
        with slot_held_migrating(cluster, slot) as (source, target):
            await warm_pool(backend, target)
            bystander_port = next(p for p in cluster.master_ports() if p not in (source, target))
            redis = backend._redis
            bystander = redis.get_node(host="127.0.0.1", port=bystander_port)
            other = asyncio.create_task(
                redis.execute_command("WAIT", 5, 1500, target_nodes=bystander)
            )
            await asyncio.sleep(0.2)
            with pytest.raises(streamsub.StreamsubError):
                await backend.ack(record, "mig2-sub", {0: ids[:1]})
            result = await asyncio.gather(other, return_exceptions=True)
            assert not isinstance(result[0], Exception), (
                f"a call on an uninvolved master failed: {result[0]!r}"
            )
