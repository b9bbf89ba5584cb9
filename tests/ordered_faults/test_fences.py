"""Partition fences: Redis serves an ordered subscription's reads of a
partition only under the fencing token of its current owner."""

from __future__ import annotations

import asyncio

import redis

import streamsub
from tests.ordered_faults._keys import keyed, ordered

KEYS = [f"k{i}" for i in range(12)]


async def test_a_stale_token_reads_nothing_and_leaves_every_entry_for_the_owner(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Four partitions, many entries each, fenced at token 7. A read under token 6
    (a deposed owner's) of all four, or of some under 7 and some under 6, takes
    nothing from the stale ones (no entry pending there) and reports them
    fenced; the owner's read under 7 then gets every entry of each."""
    await ordered(client, partitions=4)
    backend = client._backend
    topic = await backend.get_topic("orders")
    assert topic is not None
    await client.publish_many("orders", keyed(KEYS, 0, 10))
    assert await backend.fence(topic, "billing", dict.fromkeys(range(4), 7)) == set()
    assert await backend.fence(topic, "billing", {0: 6, 1: 7, 2: 8}) == {0}

    stale = await backend.read_owned(topic, "billing", "old", dict.fromkeys(range(4), 6), 100, None)
    assert stale.entries == []
    assert stale.fenced == {0, 1, 2, 3}
    mixed = await backend.read_owned(topic, "billing", "old", {0: 6, 1: 7}, 100, None)
    assert mixed.fenced == {0}
    assert {e.partition for e in mixed.entries} == {1}
    groups = await backend.group_info(topic, "billing")
    assert [g.pending for g in groups] == [0, len(mixed.entries), 0, 0]

    owner = await backend.read_owned(topic, "billing", "new", {0: 7, 2: 8, 3: 7}, 1000, 100)
    assert owner.fenced == frozenset()
    per_partition = {p: sum(1 for e in owner.entries if e.partition == p) for p in (0, 2, 3)}
    total = sum(g.length for g in groups)
    assert sum(per_partition.values()) + len(mixed.entries) == total == len(KEYS) * 10
    assert all(n > 0 for n in per_partition.values())


async def test_a_blocked_fenced_read_wakes_when_an_entry_arrives(
    client: streamsub.Client,
) -> None:
    """The fenced read cannot block inside its script: with nothing new it waits
    with a plain XREAD and reads again as soon as a message arrives, in any of
    its partitions, well before its block time is over."""
    await ordered(client, partitions=3)
    backend = client._backend
    topic = await backend.get_topic("orders")
    assert topic is not None
    tokens = dict.fromkeys(range(3), 1)
    await backend.fence(topic, "billing", tokens)
    for key in ("a", "b", "c"):
        read = asyncio.create_task(backend.read_owned(topic, "billing", "m", tokens, 10, 20_000))
        await asyncio.sleep(0.3)
        assert not read.done()
        await client.publish("orders", key.encode(), ordering_key=key)
        got = await asyncio.wait_for(read, 5)
        assert [e.fields for e in got.entries] != []
        assert got.fenced == frozenset()


async def test_a_token_is_never_handed_out_twice_even_after_the_records_lost_writes(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Member a owns four partitions under tokens it raised the fences to. The
    ownership records then lose their last writes (as after a failover to a
    replica that was behind): each token counter is back one step. a's lease
    runs out and b takes the partitions: b's tokens must be new (above a's), so
    that a's late reads are refused and b's are served, in every partition."""
    await ordered(client, partitions=4)
    backend = client._backend
    topic = await backend.get_topic("orders")
    assert topic is not None
    await client.publish_many("orders", keyed(KEYS, 0, 10))
    a = (await backend.own_partitions(topic, "billing", "a", 300, claim=True)).owned
    assert sorted(a) == [0, 1, 2, 3]
    assert await backend.fence(topic, "billing", a) == set()
    owners = "ss:{own.billing}:owners"
    redis_client.hset(owners, mapping={f"t{p}": token - 1 for p, token in a.items()})
    await asyncio.sleep(0.4)  # a's 300-ms lease runs out
    b = (await backend.own_partitions(topic, "billing", "b", 30_000, claim=True)).owned
    assert sorted(b) == [0, 1, 2, 3]
    assert all(b[p] > a[p] for p in b), (a, b)
    assert await backend.fence(topic, "billing", b) == set()
    late = await backend.read_owned(topic, "billing", "a", a, 100, None)
    assert late.entries == []
    assert late.fenced == {0, 1, 2, 3}
    served = await backend.read_owned(topic, "billing", "b", b, 1000, None)
    assert served.fenced == frozenset()
    assert len(served.entries) == len(KEYS) * 10


async def test_a_stale_tokens_sweep_takes_nothing_over(client: streamsub.Client) -> None:
    """Entries of three partitions pending for consumer x, idle or not, nacked
    ones parked: a sweep under a deposed owner's tokens (min idle 0, parked ones
    included, as a take-over sweeps) claims nothing and reports every partition
    fenced; the owner's sweep takes them all."""
    await ordered(client, partitions=3)
    backend = client._backend
    topic = await backend.get_topic("orders")
    assert topic is not None
    await client.publish_many("orders", keyed(KEYS, 0, 8))
    await backend.fence(topic, "billing", dict.fromkeys(range(3), 9))
    held = await backend.read_owned(topic, "billing", "x", dict.fromkeys(range(3), 9), 1000, None)
    assert len(held.entries) == len(KEYS) * 8
    cursors = dict.fromkeys(range(3), "-")

    found, after = await backend.reclaim(
        topic, "billing", "old", cursors, 0, 1000, 0, take_parked=True, tokens={0: 8, 1: 8, 2: 8}
    )
    assert found == []
    assert after == dict.fromkeys(range(3), "fenced")
    groups = await backend.group_info(topic, "billing")
    assert sum(g.pending for g in groups) == len(KEYS) * 8
    found, after = await backend.reclaim(
        topic, "billing", "new", cursors, 0, 1000, 0, take_parked=True, tokens={0: 9, 1: 9, 2: 9}
    )
    assert len(found) == len(KEYS) * 8
    assert set(after.values()) == {"0-0"}
