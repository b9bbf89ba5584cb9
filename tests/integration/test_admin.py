"""Topics, subscriptions and connections on Redis: what admin calls do and store."""

from __future__ import annotations

import asyncio
import datetime
import socket
from pathlib import Path
from typing import Any

import pytest
import redis

import streamsub
from streamsub._backends.redis import _keys as layout
from streamsub.testing import RedisServer, redis_server
from tests._layout import all_keys, backend_class, stream_key, stream_keys
from tests.conftest import ON_CLUSTER


def _keys(redis_client: redis.Redis) -> set[str]:
    return {key.decode() if isinstance(key, bytes) else key for key in all_keys(redis_client)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- topics ---------------------------------------------------------------------
async def test_create_topic_returns_it(client: streamsub.Client) -> None:
    """create_topic returns the topic with 16 partitions by default and its UTC creation time."""
    topic = await client.create_topic("orders")
    assert topic.name == "orders"
    assert topic.partitions == 16
    age = datetime.datetime.now(datetime.UTC) - topic.created
    assert datetime.timedelta(0) <= age < datetime.timedelta(seconds=10)


async def test_create_topic_is_idempotent(client: streamsub.Client) -> None:
    """Creating a topic again with the same partition count returns the existing topic."""
    first = await client.create_topic("orders", partitions=8)
    again = await client.create_topic("orders", partitions=8)
    assert again == first


async def test_create_topic_with_other_partitions_raises(client: streamsub.Client) -> None:
    """Creating an existing topic with another partition count raises AlreadyExistsError
    naming both counts, and leaves the topic as it was."""
    await client.create_topic("orders", partitions=16)
    with pytest.raises(streamsub.AlreadyExistsError, match=r"partitions=16, not 8"):
        await client.create_topic("orders", partitions=8)
    assert (await client.get_topic("orders")).partitions == 16


async def test_get_topic(client: streamsub.Client) -> None:
    """get_topic returns what create_topic created."""
    created = await client.create_topic("orders", partitions=4)
    assert await client.get_topic("orders") == created


async def test_unknown_topic_raises_saying_how_to_create_it(client: streamsub.Client) -> None:
    """get_topic of an unknown topic raises TopicNotFoundError (a LookupError) saying how
    to create it."""
    with pytest.raises(streamsub.TopicNotFoundError) as info:
        await client.get_topic("nope")
    assert isinstance(info.value, LookupError)
    assert "create_topic('nope')" in str(info.value)
    assert "streamsub topic create nope" in str(info.value)


async def test_list_topics_is_sorted(client: streamsub.Client) -> None:
    """list_topics returns every topic, sorted by name."""
    assert await client.list_topics() == []
    for name in ("zebra", "alpha", "mango"):
        await client.create_topic(name, partitions=2)
    assert [t.name for t in await client.list_topics()] == ["alpha", "mango", "zebra"]


async def test_delete_topic_removes_its_keys(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """delete_topic removes the topic's record and streams, messages included."""
    await client.create_topic("orders")
    await client.create_topic("other")
    await client.publish_many("orders", [b"a", b"b"])
    await client.delete_topic("orders")
    with pytest.raises(streamsub.TopicNotFoundError):
        await client.get_topic("orders")
    assert [t.name for t in await client.list_topics()] == ["other"]
    assert not any("orders" in key for key in _keys(redis_client))


async def test_delete_unknown_topic_raises(client: streamsub.Client) -> None:
    """delete_topic of an unknown topic raises TopicNotFoundError."""
    with pytest.raises(streamsub.TopicNotFoundError, match="'nope' does not exist"):
        await client.delete_topic("nope")


async def test_delete_topic_with_subscriptions_needs_force(client: streamsub.Client) -> None:
    """delete_topic of a topic with subscriptions raises FailedPreconditionError naming
    them and force=True, and deletes nothing."""
    await client.create_topic("orders")
    await client.create_subscription("billing", topic="orders")
    await client.create_subscription("audit", topic="orders")
    with pytest.raises(streamsub.FailedPreconditionError) as info:
        await client.delete_topic("orders")
    assert "audit, billing" in str(info.value)
    assert "force=True" in str(info.value)
    assert (await client.get_topic("orders")).name == "orders"
    assert [s.name for s in await client.list_subscriptions()] == ["audit", "billing"]


async def test_delete_topic_force_deletes_subscriptions(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """delete_topic(force=True) deletes the topic together with its subscriptions."""
    await client.create_topic("orders")
    await client.create_topic("other")
    await client.create_subscription("billing", topic="orders")
    await client.create_subscription("keep", topic="other")
    await client.delete_topic("orders", force=True)
    assert [s.name for s in await client.list_subscriptions()] == ["keep"]
    with pytest.raises(streamsub.SubscriptionNotFoundError):
        await client.get_subscription("billing")
    assert not any("orders" in key or "billing" in key for key in _keys(redis_client))


async def test_concurrent_create_topic_has_one_winner(client: streamsub.Client) -> None:
    """Two clients creating one topic at once with different partition counts: one
    succeeds, the other raises AlreadyExistsError, and the stored count is the winner's."""
    results = await asyncio.gather(
        client.create_topic("orders", partitions=4),
        client.create_topic("orders", partitions=8),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, streamsub.Topic)]
    lost = [r for r in results if isinstance(r, streamsub.AlreadyExistsError)]
    assert (len(won), len(lost)) == (1, 1), results
    assert (await client.get_topic("orders")).partitions == won[0].partitions


async def test_concurrent_create_subscription_is_idempotent(client: streamsub.Client) -> None:
    """Creating one subscription from many tasks at once with the same settings succeeds
    for all of them and stores it once."""
    await client.create_topic("orders")
    subs = await asyncio.gather(
        *(client.create_subscription("billing", topic="orders") for _ in range(5))
    )
    assert len({s.created for s in subs}) == 1
    assert [s.name for s in await client.list_subscriptions()] == ["billing"]


async def test_topic_can_be_created_again_after_delete(client: streamsub.Client) -> None:
    """A deleted topic's name can be used again, with another partition count."""
    await client.create_topic("orders", partitions=16)
    await client.delete_topic("orders")
    assert (await client.create_topic("orders", partitions=4)).partitions == 4


async def test_topic_metadata_lives_in_redis(
    client: streamsub.Client, server: RedisServer, redis_client: redis.Redis
) -> None:
    """A topic's partition count is stored in Redis, so a second client sees it."""
    await client.create_topic("orders", partitions=4)
    async with streamsub.connect(server.url) as other:
        assert (await other.get_topic("orders")).partitions == 4
        assert (await other.create_topic("orders", partitions=4)).partitions == 4
        with pytest.raises(streamsub.AlreadyExistsError):
            await other.create_topic("orders", partitions=16)
    record = redis_client.hgetall("ss:topic:orders")
    assert record[b"partitions"] == b"4"
    assert record[b"layout"] == (layout.CLUSTER_LAYOUT if ON_CLUSTER else layout.LAYOUT).encode()


# --- subscriptions ----------------------------------------------------------------
async def test_create_subscription_returns_its_settings(client: streamsub.Client) -> None:
    """create_subscription returns the subscription with the documented defaults."""
    await client.create_topic("orders")
    sub = await client.create_subscription("billing", topic="orders")
    assert (sub.name, sub.topic, sub.start) == ("billing", "orders", "latest")
    assert sub.ack_deadline == 30.0
    assert sub.max_delivery_attempts == 5
    assert sub.dead_letter_topic is None
    assert sub.retry_policy is None
    assert not sub.enable_message_ordering
    assert not sub.enable_exactly_once_delivery


async def test_create_subscription_is_idempotent(client: streamsub.Client) -> None:
    """Creating a subscription again with the same settings returns the existing one."""
    await client.create_topic("orders")
    await client.create_topic("dead")
    settings: dict[str, Any] = {
        "topic": "orders",
        "start": "earliest",
        "ack_deadline": 10,
        "max_delivery_attempts": 3,
        "dead_letter_topic": "dead",
        "retry_policy": streamsub.RetryPolicy(minimum_backoff=1, maximum_backoff=5),
        "enable_message_ordering": True,
    }
    first = await client.create_subscription("billing", **settings)
    again = await client.create_subscription("billing", **settings)
    assert again == first
    assert again.retry_policy == streamsub.RetryPolicy(minimum_backoff=1, maximum_backoff=5)
    assert again.dead_letter_topic == "dead"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"topic": "other"}, "topic='orders' (asked 'other')"),
        ({"start": "earliest"}, "start='latest' (asked 'earliest')"),
        ({"ack_deadline": 10}, "ack_deadline=30.0 (asked 10.0)"),
        ({"max_delivery_attempts": 3}, "max_delivery_attempts=5 (asked 3)"),
        ({"dead_letter_topic": "dead"}, "dead_letter_topic=None (asked 'dead')"),
        ({"retry_policy": streamsub.RetryPolicy()}, "retry_policy=None"),
        ({"enable_message_ordering": True}, "enable_message_ordering=False (asked True)"),
        (
            {"enable_exactly_once_delivery": True},
            "enable_exactly_once_delivery=False (asked True)",
        ),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else "",
)
async def test_create_subscription_with_other_settings_raises(
    client: streamsub.Client, change: dict[str, Any], named: str
) -> None:
    """Creating an existing subscription with another setting raises AlreadyExistsError
    naming that setting, and leaves the subscription as it was."""
    for topic in ("orders", "other", "dead"):
        await client.create_topic(topic)
    before = await client.create_subscription("billing", topic="orders")
    with pytest.raises(streamsub.AlreadyExistsError) as info:
        await client.create_subscription("billing", **{"topic": "orders", **change})
    assert named in str(info.value)
    assert await client.get_subscription("billing") == before


async def test_subscription_on_unknown_topic_raises(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """create_subscription on an unknown topic raises TopicNotFoundError and writes nothing."""
    with pytest.raises(streamsub.TopicNotFoundError, match="'nope' does not exist"):
        await client.create_subscription("billing", topic="nope")
    assert _keys(redis_client) == set()


async def test_subscription_with_unknown_dead_letter_topic_raises(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """create_subscription with an unknown dead-letter topic raises TopicNotFoundError
    naming it and creates no consumer group."""
    await client.create_topic("orders")
    keys = _keys(redis_client)
    with pytest.raises(streamsub.TopicNotFoundError, match="'dead' does not exist"):
        await client.create_subscription("billing", topic="orders", dead_letter_topic="dead")
    assert _keys(redis_client) == keys
    with pytest.raises(streamsub.SubscriptionNotFoundError):
        await client.get_subscription("billing")


async def test_get_unknown_subscription_raises(client: streamsub.Client) -> None:
    """get_subscription of an unknown subscription raises SubscriptionNotFoundError."""
    with pytest.raises(streamsub.SubscriptionNotFoundError, match="'nope' does not exist"):
        await client.get_subscription("nope")


async def test_list_subscriptions_sorted_and_by_topic(client: streamsub.Client) -> None:
    """list_subscriptions returns every subscription sorted by name, or those of one topic."""
    await client.create_topic("orders")
    await client.create_topic("other")
    for name, topic in (("zulu", "orders"), ("alpha", "other"), ("mike", "orders")):
        await client.create_subscription(name, topic=topic)
    assert [s.name for s in await client.list_subscriptions()] == ["alpha", "mike", "zulu"]
    assert [s.name for s in await client.list_subscriptions("orders")] == ["mike", "zulu"]
    assert [s.name for s in await client.list_subscriptions("other")] == ["alpha"]


async def test_delete_subscription_keeps_messages(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """delete_subscription removes its record and consumer groups; the messages stay."""
    await client.create_topic("orders")
    await client.create_subscription("billing", topic="orders")
    await client.create_subscription("audit", topic="orders")
    await client.publish_many("orders", [b"a", b"b", b"c"])
    await client.delete_subscription("billing")
    with pytest.raises(streamsub.SubscriptionNotFoundError):
        await client.get_subscription("billing")
    assert [s.name for s in await client.list_subscriptions()] == ["audit"]
    streams = stream_keys(redis_client, "orders", 16)
    for key in streams:
        assert [g["name"] for g in redis_client.xinfo_groups(key)] == [b"audit"]
    assert sum(redis_client.xlen(key) for key in streams) == 3
    with pytest.raises(streamsub.SubscriptionNotFoundError):
        await client.delete_subscription("billing")


async def test_subscription_stats(client: streamsub.Client) -> None:
    """subscription_stats counts the topic's messages and, before any read, no pending ones
    and all of them as lag (where the server reports lag)."""
    await client.create_topic("orders")
    await client.create_subscription("billing", topic="orders")
    await client.publish_many("orders", [b"a", b"b", b"c"])
    stats = await client.subscription_stats("billing")
    assert (stats.subscription, stats.topic) == ("billing", "orders")
    assert (stats.messages, stats.pending) == (3, 0)
    assert stats.lag in (3, None)  # Redis 6.2 does not report lag
    assert len(stats.partitions) == 16


# --- the Redis layout ---------------------------------------------------------------
async def test_streams_carry_a_hash_tag_per_partition(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """Each partition is a stream named ss:{<topic>.<n>} (on a cluster
    ss:{<topic>.<n>|<salt>} where a salt balances the masters): its own hash tag, so
    partitions spread over a cluster's slots."""
    await client.create_topic("orders")
    await client.create_subscription("billing", topic="orders")
    streams = {key for key in _keys(redis_client) if redis_client.type(key) == b"stream"}
    assert streams == set(stream_keys(redis_client, "orders", 16))
    tags = {key[key.index("{") + 1 : key.index("}")] for key in streams}
    assert {tag.partition("|")[0] for tag in tags} == {f"orders.{n}" for n in range(16)}
    assert len(tags) == 16


async def test_consumer_groups_on_every_partition(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """create_subscription creates a consumer group of that name on all 16 partitions."""
    await client.create_topic("orders")
    await client.create_subscription("billing", topic="orders")
    for key in stream_keys(redis_client, "orders", 16):
        groups = redis_client.xinfo_groups(key)
        assert [g["name"] for g in groups] == [b"billing"], key
        assert groups[0]["pending"] == 0


async def test_start_latest_and_earliest_set_the_group_position(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A 'latest' subscription's groups start after the last entry, an 'earliest' one's at 0."""
    await client.create_topic("orders", partitions=1)
    (message_id,) = await client.publish_many("orders", [b"old"])
    await client.create_subscription("latest", topic="orders", start="latest")
    await client.create_subscription("earliest", topic="orders", start="earliest")
    stream = stream_key(redis_client, "orders", 0)
    groups = {g["name"]: g for g in redis_client.xinfo_groups(stream)}
    assert groups[b"latest"]["last-delivered-id"].decode() == message_id.split("-", 1)[1]
    assert groups[b"earliest"]["last-delivered-id"] == b"0-0"


# --- connections ----------------------------------------------------------------------
async def test_connect_to_unreachable_server_raises_unavailable() -> None:
    """Connecting to a server that does not answer raises UnavailableError naming the URL."""
    url = f"redis://127.0.0.1:{_free_port()}/0"
    with pytest.raises(streamsub.UnavailableError) as info:
        async with streamsub.connect(url):
            pass
    assert url in str(info.value)
    assert isinstance(info.value, streamsub.BackendError)
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://alice:s3cret@127.0.0.1:{port}/0", "redis://alice:***@127.0.0.1:{port}/0"),
        ("redis://:s3cret@127.0.0.1:{port}/0", "redis://:***@127.0.0.1:{port}/0"),
        ("rediss://alice:s3cret@localhost:{port}/2", "rediss://alice:***@localhost:{port}/2"),
        ("redis://127.0.0.1:{port}/0", "redis://127.0.0.1:{port}/0"),
    ],
    ids=["user-and-password", "password-only", "tls", "no-password"],
)
async def test_url_password_is_redacted(url: str, shown: str) -> None:
    """client.url and connection errors show the URL with its password replaced by ***."""
    port = _free_port()
    client = streamsub.connect(url.format(port=port))
    assert client.url == shown.format(port=port)
    with pytest.raises(streamsub.UnavailableError) as info:
        async with client:
            pass
    assert "s3cret" not in str(info.value)
    assert shown.format(port=port) in str(info.value)


def test_url_password_in_query_is_redacted() -> None:
    """A password given as ?password=... (redis-py's form for unix sockets) is redacted too."""
    client = streamsub.connect("unix:///tmp/redis.sock?db=0&password=s3cret")
    assert "s3cret" not in client.url
    assert client.url == "unix:///tmp/redis.sock?db=0&password=***"


def test_url_password_is_redacted_for_ipv6_host() -> None:
    """A redacted URL with an IPv6 host keeps the brackets, so it stays a valid URL."""
    client = streamsub.connect("redis://:s3cret@[::1]:6379/0")
    assert client.url == "redis://:***@[::1]:6379/0"


@pytest.mark.standalone  # a private standalone server's password
async def test_wrong_password_raises_unavailable_saying_so(data_dir: Path) -> None:
    """A server that refuses the password raises UnavailableError about the credentials,
    without the password; the right password connects."""
    # Set after start: RedisServer's readiness PING does not authenticate.
    with redis_server(data_dir) as protected:
        with redis.Redis.from_url(protected.url) as admin:
            admin.config_set("requirepass", "right-pw")
        port = protected.port
        wrong = streamsub.connect(f"redis://:wrong-pw@127.0.0.1:{port}/0")
        with pytest.raises(streamsub.UnavailableError, match="credentials") as info:
            async with wrong:
                pass
        assert "wrong-pw" not in str(info.value)
        async with streamsub.connect(f"redis://:right-pw@127.0.0.1:{port}/0") as right:
            assert await right.list_topics() == []


async def test_closed_client_raises_closed_error(server: RedisServer) -> None:
    """Every call on a closed client raises ClosedError saying to create a new one."""
    client = streamsub.connect(server.url)
    async with client:
        pass
    with pytest.raises(streamsub.ClosedError, match=r"streamsub\.connect\(\)"):
        await client.list_topics()
    with pytest.raises(streamsub.ClosedError):
        await client.publish("orders", b"x")


@pytest.mark.parametrize(
    "url",
    [
        "redis://alice:pa/ss0rd@127.0.0.1:{port}/0",
        "redis://alice:pa?ss0rd@127.0.0.1:{port}/0",
        "redis://alice:pa#ss0rd@127.0.0.1:{port}/0",
        "redis://alice:pa@ss0rd@127.0.0.1:{port}/0",
        "redis://alice:ss0rd@127.0.0.1:notaport/0",
        "redis://:ss0rd/x@127.0.0.1:{port}/0?db=0",
    ],
    ids=["slash", "question-mark", "hash", "at", "bad-port", "no-user"],
)
async def test_url_password_with_url_delimiters_never_leaks(url: str) -> None:
    """A password holding an unencoded '/', '?', '#' or '@', or a URL with a bad port,
    shows neither in client.url nor in the error that connect() raises."""
    url = url.format(port=_free_port())
    try:
        client = streamsub.connect(url)
    except streamsub.StreamsubError as exc:  # refused at once: the message is what leaks
        text = str(exc)
    else:
        assert "ss0rd" not in client.url
        assert "***" in client.url
        with pytest.raises(streamsub.StreamsubError) as info:
            async with client:
                pass
        text = str(info.value)
    assert "ss0rd" not in text
    assert "***" in text


async def test_retention_update_racing_delete_topic_recreates_nothing(
    client: streamsub.Client, server: RedisServer, redis_client: redis.Redis
) -> None:
    """Setting a retention policy on a topic deleted meanwhile raises
    TopicNotFoundError and leaves no half record behind."""
    await client.create_topic("orders", partitions=4)
    backend = backend_class(server.url)(server.url)
    try:
        record = await backend.get_topic("orders")
        assert record is not None
        await backend.delete_topic(record)
        with pytest.raises(streamsub.TopicNotFoundError):
            await backend.set_retention(record, streamsub.Retention(max_length=10))
    finally:
        await backend.close()
    assert redis_client.exists("ss:topic:orders") == 0
    with pytest.raises(streamsub.TopicNotFoundError):
        await client.update_topic_retention("orders", streamsub.Retention(max_length=10))


async def test_a_damaged_record_raises_a_clear_backend_error(
    client: streamsub.Client, redis_client: redis.Redis
) -> None:
    """A topic or subscription record missing fields raises BackendError naming
    the record, not a bare KeyError."""
    redis_client.hset("ss:topic:orders", "retention", "")
    redis_client.sadd("ss:topics", "orders")
    redis_client.hset("ss:sub:billing", mapping={"name": "billing", "topic": "orders"})
    redis_client.sadd("ss:subscriptions", "billing")
    for call in (
        client.get_topic("orders"),
        client.list_topics(),
        client.get_subscription("billing"),
    ):
        with pytest.raises(streamsub.BackendError, match="damaged"):
            await call
