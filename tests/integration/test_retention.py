"""Retention on a real Redis: never past the safe point, hard caps counted exactly."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio.cluster

import streamsub
from streamsub._engine.trimmer import Trimmer, enforce_retention
from streamsub.testing import RedisServer, redis_server
from tests._layout import backend_class, node_urls, stream_key, with_credentials
from tests._wait import until
from tests.conftest import ON_CLUSTER

PARTITIONS = 4
PER_PARTITION = 10_000


@pytest.fixture
async def client(server: RedisServer, redis_client: redis.Redis) -> AsyncIterator[streamsub.Client]:
    """A client on an emptied server that trims only when a test asks it to."""
    redis_client.flushall()
    async with streamsub.connect(server.url, trim_in_background=False) as connected:
        yield connected


def _lengths(redis_client: redis.Redis, topic: str) -> list[int]:
    return [int(redis_client.xlen(stream_key(redis_client, topic, p))) for p in range(PARTITIONS)]


async def _fill(client: streamsub.Client, topic: str, per_partition: int) -> list[str]:
    """Publish ``per_partition`` messages to each partition, over 50 ordering keys each."""
    keys: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    i = 0
    while min(len(k) for k in keys.values()) < 50:
        key = f"key-{i}"
        keys[streamsub.fnv1a_32(key.encode()) % PARTITIONS].append(key)
        i += 1
    messages = [
        streamsub.OutgoingMessage(data=str(i).encode(), ordering_key=keys[p][i % 50])
        for i in range(per_partition)
        for p in range(PARTITIONS)
    ]
    ids: list[str] = []
    for start in range(0, len(messages), 5000):
        ids += await client.publish_many(topic, messages[start : start + 5000])
    return ids


def _read(redis_client: redis.Redis, topic: str, group: str, count: int) -> dict[int, list[str]]:
    """Deliver ``count`` entries of every partition to ``group`` (they become pending)."""
    read: dict[int, list[str]] = {}
    for p in range(PARTITIONS):
        reply = redis_client.xreadgroup(
            group, "inspector", {stream_key(redis_client, topic, p): ">"}, count=count
        )
        read[p] = [entry_id.decode() for entry_id, _ in reply[0][1]] if reply else []
    return read


async def _consume_all(client: streamsub.Client, subscription: str, total: int) -> None:
    seen: set[str] = set()

    async def handle(message: streamsub.Message) -> None:
        seen.add(message.message_id)

    async with client.subscribe(subscription, handle):
        await until(lambda: len(seen) >= total, 60, f"{total} messages handled")
    stats = await client.subscription_stats(subscription)
    assert stats.pending == 0


async def test_a_group_behind_keeps_everything_until_it_catches_up(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """With a group 10,000 entries behind per partition and max_length 1,000, nothing
    unacknowledged is deleted; once the group has acknowledged, every partition
    shrinks to the policy."""
    await client.create_topic(
        "orders", partitions=PARTITIONS, retention=streamsub.Retention(max_length=1000)
    )
    # A short ack deadline: the entries left pending below are reclaimed soon.
    await client.create_subscription("slow", topic="orders", start="earliest", ack_deadline=1)
    await client.create_subscription("fast", topic="orders", start="earliest")
    await _fill(client, "orders", PER_PARTITION)
    # "fast" has acknowledged everything; "slow" has 100 delivered per partition,
    # the first 50 of them acknowledged.
    for p, ids in _read(redis_client, "orders", "fast", PER_PARTITION).items():
        redis_client.xack(stream_key(redis_client, "orders", p), "fast", *ids)
    pending = _read(redis_client, "orders", "slow", 100)
    for p, ids in pending.items():
        redis_client.xack(stream_key(redis_client, "orders", p), "slow", *ids[:50])

    result = await client.enforce_retention("orders")

    assert [t.trimmed for t in result.partitions] == [50] * PARTITIONS
    assert result.dropped_unacked == 0
    assert _lengths(redis_client, "orders") == [PER_PARTITION - 50] * PARTITIONS
    for p, ids in pending.items():
        first = redis_client.xrange(stream_key(redis_client, "orders", p), count=1)[0][0].decode()
        assert first == ids[50], "the first pending entry is the first one kept"

    await _consume_all(client, "slow", PARTITIONS * (PER_PARTITION - 100) + PARTITIONS * 50)
    result = await client.enforce_retention("orders")

    assert [t.trimmed for t in result.partitions] == [PER_PARTITION - 50 - 1000] * PARTITIONS
    assert _lengths(redis_client, "orders") == [1000] * PARTITIONS
    assert result.dropped_unacked == 0


async def test_drop_unacked_counts_exactly_what_it_dropped(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """With drop_unacked=True the policy is a hard cap, and the count of dropped
    unacknowledged entries (pending or never delivered) is exact and kept in Redis."""
    await client.create_topic(
        "orders",
        partitions=PARTITIONS,
        retention=streamsub.Retention(max_length=1000, drop_unacked=True),
    )
    await client.create_subscription("slow", topic="orders", start="earliest")
    await client.create_subscription("fast", topic="orders", start="earliest")
    await _fill(client, "orders", PER_PARTITION)
    for p, ids in _read(redis_client, "orders", "fast", PER_PARTITION).items():
        redis_client.xack(stream_key(redis_client, "orders", p), "fast", *ids)
    for p, ids in _read(redis_client, "orders", "slow", 100).items():
        redis_client.xack(stream_key(redis_client, "orders", p), "slow", *ids[:50])

    result = await client.enforce_retention("orders")

    # 9,000 deleted per partition; the first 50 were acknowledged by both groups.
    assert [t.trimmed for t in result.partitions] == [9000] * PARTITIONS
    assert [t.dropped_unacked for t in result.partitions] == [8950] * PARTITIONS
    assert _lengths(redis_client, "orders") == [1000] * PARTITIONS
    counters = [
        int(redis_client.get(f"{stream_key(redis_client, 'orders', p)}:dropped")) for p in range(4)
    ]
    assert counters == [8950] * PARTITIONS
    # The dropped pending entries left the pending list: nothing dangles.
    assert [
        redis_client.xpending(stream_key(redis_client, "orders", p), "slow")["pending"]
        for p in range(4)
    ] == [0] * PARTITIONS
    # A second pass finds nothing more to do and counts nothing twice.
    again = await client.enforce_retention("orders")
    assert (again.trimmed, again.dropped_unacked) == (0, 0)


def _fill_old(redis_client: redis.Redis, topic: str, per_partition: int, age: float) -> set[str]:
    """Add ``per_partition`` entries to each partition with ids ``age`` seconds
    old by the server's clock (as a producer that chooses its ids may)."""
    seconds, micros = redis_client.time()
    ms = int(seconds) * 1000 + int(micros) // 1000 - int(age * 1000)
    added = set()
    for p in range(PARTITIONS):
        for seq in range(per_partition):
            entry_id = f"{ms}-{seq}"
            redis_client.xadd(stream_key(redis_client, topic, p), {"d": "old"}, id=entry_id)
            added.add(f"{p}-{entry_id}")
    return added


async def test_max_age_trims_by_the_server_clock(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """max_age deletes exactly the acknowledged entries older than the server's
    time minus max_age."""
    await client.create_topic(
        "events", partitions=PARTITIONS, retention=streamsub.Retention(max_age=3600)
    )
    await client.create_subscription("reader", topic="events", start="earliest")
    old = _fill_old(redis_client, "events", 300, 7200)
    new = await _fill(client, "events", 200)
    for p, ids in _read(redis_client, "events", "reader", 10_000).items():
        redis_client.xack(stream_key(redis_client, "events", p), "reader", *ids)

    backend = backend_class(server.url)(server.url)
    try:
        topic = await backend.get_topic("events")
        assert topic is not None
        result = await enforce_retention(backend, topic, now=time.time())
    finally:
        await backend.close()

    assert result.trimmed == len(old)
    assert _lengths(redis_client, "events") == [200] * PARTITIONS
    kept = {
        f"{p}-{entry_id.decode()}"
        for p in range(PARTITIONS)
        for entry_id, _ in redis_client.xrange(stream_key(redis_client, "events", p))
    }
    assert kept == set(new)


async def test_max_age_stops_at_the_first_pending_entry(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """An entry older than max_age but still pending is kept, with all after it."""
    await client.create_topic(
        "events", partitions=PARTITIONS, retention=streamsub.Retention(max_age=3600)
    )
    await client.create_subscription("reader", topic="events", start="earliest")
    _fill_old(redis_client, "events", 500, 7200)
    for p, ids in _read(redis_client, "events", "reader", 10_000).items():
        redis_client.xack(stream_key(redis_client, "events", p), "reader", *ids[:100], *ids[101:])
    backend = backend_class(server.url)(server.url)
    try:
        topic = await backend.get_topic("events")
        assert topic is not None
        result = await enforce_retention(backend, topic, now=time.time())
    finally:
        await backend.close()
    assert [t.trimmed for t in result.partitions] == [100] * PARTITIONS
    assert _lengths(redis_client, "events") == [400] * PARTITIONS


async def test_background_trimmer_waits_for_the_topic_lock(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A client trims the topics it publishes to in the background, but not while
    another trimmer holds the topic's lock in Redis."""
    redis_client.flushall()
    redis_client.set("ss:lock:retention:orders", "someone-else", px=60_000)
    async with streamsub.connect(server.url, retention_interval=0.05) as client:
        await client.create_topic(
            "orders", partitions=PARTITIONS, retention=streamsub.Retention(max_length=10)
        )
        await _fill(client, "orders", 100)
        trimmer = client._trimmer
        assert trimmer is not None
        passes = trimmer.passes
        await until(lambda: trimmer.passes >= passes + 3, 10, "three background passes")
        assert _lengths(redis_client, "orders") == [100] * PARTITIONS
        redis_client.delete("ss:lock:retention:orders")
        await until(
            lambda: _lengths(redis_client, "orders") == [10] * PARTITIONS,
            10,
            "the background trimmer to shrink every partition to 10",
        )


async def test_update_topic_retention_is_stored(client: streamsub.Client) -> None:
    """A topic's retention is stored with it, changeable later, and conflicts only with
    another policy given explicitly on re-create."""
    created = await client.create_topic("orders", partitions=2)
    assert created.retention is None
    policy = streamsub.Retention(max_age=60, max_length=500, drop_unacked=True)
    updated = await client.update_topic_retention("orders", policy)
    assert updated.retention == policy
    assert (await client.get_topic("orders")).retention == policy
    with pytest.raises(streamsub.AlreadyExistsError, match="retention"):
        await client.create_topic("orders", partitions=2, retention=streamsub.Retention(max_age=5))
    assert (await client.create_topic("orders", partitions=2, retention=policy)) == updated
    # Without a policy, creating keeps the one an operator set.
    assert (await client.create_topic("orders", partitions=2)) == updated
    await client.update_topic_retention("orders", None)
    assert (await client.get_topic("orders")).retention is None


async def test_connect_warns_when_redis_may_evict(
    client: streamsub.Client,
    server: RedisServer,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Connecting to a server whose maxmemory-policy evicts keys logs a warning (on a
    cluster, when one master's does: the partitions there may vanish)."""
    redis_client.config_set("maxmemory-policy", "allkeys-lru")  # a cluster's default node
    try:
        with caplog.at_level(logging.WARNING, logger="streamsub"):
            async with streamsub.connect(server.url):
                pass
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")
    assert any("allkeys-lru" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streamsub"):
        async with streamsub.connect(server.url):
            pass
    assert not caplog.records


@pytest.mark.standalone  # maxmemory on a private server
async def test_out_of_memory_is_a_clear_publish_error() -> None:
    """A publish refused for lack of memory raises ResourceExhaustedError saying what to do."""
    with redis_server() as small:
        async with streamsub.connect(small.url) as client:
            await client.create_topic("orders", partitions=2)
            plain = redis.Redis.from_url(small.url)
            used = int(plain.info("memory")["used_memory"])
            plain.config_set("maxmemory", used + 200_000)
            plain.close()
            batch = [b"x" * 10_000] * 50
            with pytest.raises(streamsub.ResourceExhaustedError, match="maxmemory"):  # noqa: PT012
                for _ in range(100):  # 50 MB in all: one of these is refused
                    await client.publish_many("orders", batch)


async def test_retention_of_a_dead_letter_topic_is_enforced_for_its_subscribers(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A subscriber's client keeps the subscription's dead-letter topic within its policy."""
    redis_client.flushall()
    async with streamsub.connect(server.url, retention_interval=0.05) as client:
        await client.create_topic("orders", partitions=PARTITIONS)
        await client.create_topic("dead", partitions=2, retention=streamsub.Retention(max_length=5))
        await client.create_subscription(
            "billing", topic="orders", dead_letter_topic="dead", max_delivery_attempts=1
        )

        async def refuse(message: streamsub.Message) -> None:
            raise RuntimeError("poison")

        dead = [stream_key(redis_client, "dead", p) for p in range(2)]
        async with client.subscribe("billing", refuse) as subscriber:
            for i in range(60):
                await client.publish("orders", str(i).encode())
            await until(lambda: subscriber.statistics().dead_lettered == 60, 30, "60 dead letters")
            await until(
                lambda: all(int(redis_client.xlen(key)) <= 5 for key in dead),
                30,
                "the dead-letter topic trimmed to 5 per partition",
            )
        assert 0 < sum(int(redis_client.xlen(key)) for key in dead) <= 10


async def test_trimmer_pass_watches_subscriptions(
    client: streamsub.Client, redis_client: redis.Redis, server: RedisServer
) -> None:
    """A trimmer pass ages entries by the server's clock, covers the topics of the
    subscriptions it watches, and releases the topic's lock afterwards."""
    await client.create_topic(
        "events", partitions=PARTITIONS, retention=streamsub.Retention(max_age=60)
    )
    await client.create_subscription("reader", topic="events", start="earliest")
    _fill_old(redis_client, "events", 100, 120)
    await _fill(client, "events", 100)
    for p, ids in _read(redis_client, "events", "reader", 10_000).items():
        redis_client.xack(stream_key(redis_client, "events", p), "reader", *ids)
    backend = backend_class(server.url)(server.url)
    try:
        trimmer = Trimmer(backend, interval=60)
        trimmer._subscriptions.add("reader")  # what watch_subscription records
        results = await trimmer.run_once()
    finally:
        await backend.close()
    assert results["events"].trimmed == 100 * PARTITIONS
    assert _lengths(redis_client, "events") == [100] * PARTITIONS
    assert redis_client.exists("ss:lock:retention:events") == 0


# redis-py 5.0's cluster client sends INFO to each node it discovers the cluster from.
_CLUSTER_CLIENT_NEEDS_INFO = '"INFO"' in inspect.getsource(
    redis.asyncio.cluster.NodesManager.initialize
)


@pytest.mark.skipif(
    ON_CLUSTER and _CLUSTER_CLIENT_NEEDS_INFO,
    reason="this redis-py's cluster client needs INFO to connect (README, Redis Cluster)",
)
async def test_a_user_without_info_still_connects_and_trims(
    server: RedisServer, redis_client: redis.Redis
) -> None:
    """A Redis user denied INFO can connect and enforce retention (memory policy and
    version unknown: the safe-point path is used)."""
    redis_client.flushall()
    for node_url in node_urls(server.url):  # every node of a cluster knows its own users
        with redis.Redis.from_url(node_url) as node:
            node.acl_setuser(
                "no-info", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
                commands=["+@all", "-info"],
            )  # fmt: skip
    try:
        url = with_credentials(server.url, "no-info", "secret")
        async with streamsub.connect(url, trim_in_background=False) as client:
            await client.create_topic(
                "orders", partitions=2, retention=streamsub.Retention(max_length=5)
            )
            await client.publish_many("orders", [b"x"] * 30)
            result = await client.enforce_retention("orders")
        assert result.trimmed == 25  # one publish_many batch: one partition of 30
        assert all(
            int(redis_client.xlen(stream_key(redis_client, "orders", p))) <= 5 for p in range(2)
        )
    finally:
        for node_url in node_urls(server.url):
            with redis.Redis.from_url(node_url) as node:
                node.acl_deluser("no-info")


async def test_deleting_a_subscription_that_was_behind_lets_the_stream_shrink(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A subscription behind holds every partition back; once it is deleted the next
    pass shrinks every partition to the policy (on Redis 8.2.3, XTRIM … ACKED
    alone kept the deleted group's position cached and trimmed nothing more)."""
    await client.create_topic(
        "orders", partitions=PARTITIONS, retention=streamsub.Retention(max_length=100)
    )
    await client.create_subscription("slow", topic="orders", start="earliest")
    await client.create_subscription("fast", topic="orders", start="earliest")
    await _fill(client, "orders", 1000)
    for p, ids in _read(redis_client, "orders", "fast", 1000).items():
        redis_client.xack(stream_key(redis_client, "orders", p), "fast", *ids)
    _read(redis_client, "orders", "slow", 30)

    result = await client.enforce_retention("orders")

    assert (result.trimmed, result.dropped_unacked) == (0, 0)
    await client.delete_subscription("slow")
    result = await client.enforce_retention("orders")
    assert [t.trimmed for t in result.partitions] == [900] * PARTITIONS
    assert _lengths(redis_client, "orders") == [100] * PARTITIONS
