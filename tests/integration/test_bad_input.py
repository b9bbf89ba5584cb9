"""Bad input gets a clear error of the right class, and writes nothing at all.

Every case compares the whole server before and after: the same keys with the
same contents (``DUMP``), so no stream grew, no record or group appeared.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

import streamsub
from streamsub import OutgoingMessage
from streamsub.testing import RedisServer
from tests._layout import all_keys, stream_keys

BAD_NAMES = [
    ("", "must not be empty"),
    ("ab", "invalid {kind} name 'ab'"),
    ("1abc", "start with a letter"),
    ("a{b}c", "invalid {kind} name 'a{{b}}c'"),
    ("a b c", "invalid {kind} name 'a b c'"),
    ("a:b:c", "invalid {kind} name 'a:b:c'"),
    ("x" * 256, "3 to 255 characters"),
    ("goog-x", "must not start with 'goog'"),
]


def _state(redis_client: redis.Redis) -> dict[Any, Any]:
    """Every key with its serialized value: equal states mean nothing was written."""
    return {key: redis_client.dump(key) for key in sorted(all_keys(redis_client))}


def _stream_total(redis_client: redis.Redis, streams: list[str]) -> int:
    return sum(redis_client.xlen(key) for key in streams if redis_client.exists(key))


@pytest.fixture
def unchanged(orders: streamsub.Client, redis_client: redis.Redis) -> Iterator[None]:
    """Fail the test if the server's keys or their contents changed after "orders" was set up."""
    streams = stream_keys(redis_client, "orders", 16)
    before, total = _state(redis_client), _stream_total(redis_client, streams)
    assert total == 1
    yield
    after = _state(redis_client)
    assert _stream_total(redis_client, streams) == total, "messages were written"
    assert sorted(after.keys() - before.keys()) == [], "keys were created"
    assert sorted(before.keys() - after.keys()) == [], "keys were deleted"
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == [], "keys were changed"


@pytest.fixture
async def orders(client: streamsub.Client) -> streamsub.Client:
    """A client with topic "orders" (its streams made by subscription "billing") holding
    one message."""
    await client.create_topic("orders")
    await client.create_subscription("billing", topic="orders")
    await client.publish("orders", b"already there")
    return client


@pytest.fixture
async def small(server: RedisServer, orders: streamsub.Client) -> AsyncIterator[streamsub.Client]:
    """A client on the same server whose messages may be at most 1000 bytes."""
    limits = streamsub.Limits(max_message_bytes=1000)
    async with streamsub.connect(server.url, limits=limits) as connected:
        yield connected


# --- messages ---------------------------------------------------------------------
MESSAGE_CASES = [
    pytest.param(
        {"data": "text"},
        streamsub.InvalidTypeError,
        "must be bytes, got str (encode it first, e.g. text.encode())",
        id="data-str",
    ),
    pytest.param({"data": 7}, streamsub.InvalidTypeError, "must be bytes, got int", id="data-int"),
    pytest.param(
        {"data": None}, streamsub.InvalidTypeError, "must be bytes, got NoneType", id="data-None"
    ),
    pytest.param(
        {"data": {"a": 1}}, streamsub.InvalidTypeError, "must be bytes, got dict", id="data-dict"
    ),
    pytest.param(
        {"data": b"x", "attributes": {1: "one"}},
        streamsub.InvalidTypeError,
        "attribute keys must be str, got int",
        id="attribute-key-int",
    ),
    pytest.param(
        {"data": b"x", "attributes": {b"k": "v"}},
        streamsub.InvalidTypeError,
        "attribute keys must be str, got bytes",
        id="attribute-key-bytes",
    ),
    pytest.param(
        {"data": b"x", "attributes": {"n": 1}},
        streamsub.InvalidTypeError,
        "attribute 'n' must have a str value, got int",
        id="attribute-value-int",
    ),
    pytest.param(
        {"data": b"x", "attributes": {"ok": "fine", "n": None}},
        streamsub.InvalidTypeError,
        "attribute 'n' must have a str value, got NoneType",
        id="attribute-value-None",
    ),
    pytest.param(
        {"data": b"x", "attributes": [("k", "v")]},
        streamsub.InvalidTypeError,
        "attributes must be a mapping of str to str, got list",
        id="attributes-list",
    ),
    pytest.param(
        {"data": b"x", "attributes": "k=v"},
        streamsub.InvalidTypeError,
        "attributes must be a mapping of str to str, got str",
        id="attributes-str",
    ),
    pytest.param(
        {"data": b"x", "attributes": []},
        streamsub.InvalidTypeError,
        "attributes must be a mapping of str to str, got list",
        id="attributes-empty-list",
    ),
    pytest.param(
        {"data": b"x", "attributes": {"": "v"}},
        streamsub.InvalidArgumentError,
        "attribute key '' must be 1 to 256 bytes",
        id="attribute-key-empty",
    ),
    pytest.param(
        {"data": b"x", "ordering_key": 7},
        streamsub.InvalidTypeError,
        "ordering_key must be a str or None, got int",
        id="ordering-key-int",
    ),
    pytest.param(
        {"data": b"x", "ordering_key": b"key"},
        streamsub.InvalidTypeError,
        "ordering_key must be a str or None, got bytes",
        id="ordering-key-bytes",
    ),
    pytest.param(
        {"data": b"x", "ordering_key": "k" * 1025},
        streamsub.InvalidArgumentError,
        "ordering_key is 1025 bytes; the limit is 1024",
        id="ordering-key-too-long",
    ),
]


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(("message", "error", "text"), MESSAGE_CASES)
async def test_publish_bad_message(
    orders: streamsub.Client, message: dict[str, Any], error: type[Exception], text: str
) -> None:
    """publish of a message with data, attributes or key of the wrong type or shape raises
    an InvalidArgumentError saying what is wrong, and writes nothing."""
    with pytest.raises(error, match=_literal(text)):
        await orders.publish("orders", **message)


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(("message", "error", "text"), MESSAGE_CASES)
async def test_publish_many_bad_last_message(
    orders: streamsub.Client, message: dict[str, Any], error: type[Exception], text: str
) -> None:
    """publish_many whose last message only is bad raises naming its index and writes none
    of the messages, the good ones included."""
    good = [OutgoingMessage(data=f"good {i}".encode(), ordering_key=f"k{i}") for i in range(20)]
    with pytest.raises(error, match=_literal("message 20: ") + ".*" + _literal(text)):
        await orders.publish_many("orders", [*good, OutgoingMessage(**message)])


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("bad", "text"),
    [
        pytest.param("text", "message data must be bytes, got str", id="str"),
        pytest.param(None, "message data must be bytes, got NoneType", id="None"),
        pytest.param({"data": b"x"}, "message data must be bytes, got dict", id="dict"),
    ],
)
async def test_publish_many_bad_last_plain_item(
    orders: streamsub.Client, bad: object, text: str
) -> None:
    """publish_many of plain items whose last one is not bytes raises and writes nothing."""
    with pytest.raises(streamsub.InvalidTypeError, match=_literal(f"message 3: {text}")):
        await orders.publish_many("orders", [b"a", b"b", b"c", bad])  # type: ignore[list-item]


# --- sizes ----------------------------------------------------------------------------
@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("message", "size"),
    [
        pytest.param({"data": b"x" * 1001}, 1001, id="data"),
        pytest.param({"data": b"x" * 990, "ordering_key": "k" * 11}, 1001, id="data-and-key"),
        pytest.param(
            {"data": b"x" * 990, "attributes": {"name": "v" * 7}}, 1001, id="data-and-attributes"
        ),
    ],
)
async def test_message_over_the_limit(
    small: streamsub.Client, message: dict[str, Any], size: int
) -> None:
    """A message whose data, ordering key and attributes together exceed
    Limits.max_message_bytes raises MessageTooLargeError with both sizes, writing nothing."""
    text = f"message is {size} bytes (data, ordering key and attributes); the limit is 1000"
    with pytest.raises(streamsub.MessageTooLargeError, match=_literal(text)):
        await small.publish("orders", **message)
    with pytest.raises(streamsub.MessageTooLargeError, match=_literal(f"message 1: {text}")):
        await small.publish_many(
            "orders", [OutgoingMessage(data=b"ok"), OutgoingMessage(**message)]
        )


async def test_message_at_the_limit_is_published(small: streamsub.Client) -> None:
    """A message of exactly Limits.max_message_bytes is published."""
    message_id = await small.publish("orders", b"x" * 990, attributes={"name": "v" * 6})
    assert message_id


@pytest.mark.usefixtures("unchanged")
async def test_message_over_the_default_limit(orders: streamsub.Client) -> None:
    """With the default limits a 10,000,001-byte message raises MessageTooLargeError
    naming the 10 MB limit, and writes nothing."""
    with pytest.raises(
        streamsub.MessageTooLargeError,
        match=_literal("message is 10000001 bytes") + ".*" + _literal("the limit is 10000000"),
    ):
        await orders.publish("orders", b"x" * 10_000_001)


@pytest.mark.usefixtures("unchanged")
async def test_too_many_attributes(orders: streamsub.Client) -> None:
    """A message with more than 100 attributes raises InvalidArgumentError and writes nothing."""
    attributes = {f"a{i}": "v" for i in range(101)}
    with pytest.raises(streamsub.InvalidArgumentError, match="at most 100 attributes, got 101"):
        await orders.publish("orders", b"x", attributes=attributes)


# --- topics ---------------------------------------------------------------------------
@pytest.mark.usefixtures("unchanged")
async def test_publish_to_unknown_topic(orders: streamsub.Client) -> None:
    """publish to a topic that does not exist raises TopicNotFoundError saying how to create
    it, and creates nothing."""
    with pytest.raises(streamsub.TopicNotFoundError, match=_literal("create_topic('nope')")):
        await orders.publish("nope", b"x")
    with pytest.raises(streamsub.TopicNotFoundError, match=_literal("'nope' does not exist")):
        await orders.publish_many("nope", [b"x", b"y"])


async def test_publish_to_topic_deleted_by_another_client(
    orders: streamsub.Client, server: RedisServer, redis_client: redis.Redis
) -> None:
    """publish to a topic that another client deleted raises TopicNotFoundError and writes
    nothing, even when this client published to it before."""
    async with streamsub.connect(server.url) as other:
        await other.delete_topic("orders", force=True)
    before = _state(redis_client)
    try:
        with pytest.raises(streamsub.TopicNotFoundError):
            await orders.publish("orders", b"into the void", ordering_key="k")
    finally:
        assert _state(redis_client) == before, "an orphan stream was written"


async def test_publishes_after_the_topic_was_made_anew_go_to_the_new_topic(
    orders: streamsub.Client, server: RedisServer, redis_client: redis.Redis
) -> None:
    """Another client deletes "orders" (16 partitions): this client's publishes
    of every kind queued at once (50 plain, 50 keyed, 5 publish_many of data
    alone and 5 keyed, 10 messages each) all fail with TopicNotFoundError. The
    topic made anew with 3 partitions, the next ones, of every kind, are all
    stored in it: the client looked the topic up anew rather than write by the
    old one's partitions (those past 2 would fail)."""
    async with streamsub.connect(server.url) as other:
        await other.delete_topic("orders", force=True)

    def calls() -> list[Awaitable[object]]:
        return [
            *(orders.publish("orders", b"plain %d" % i) for i in range(50)),
            *(
                orders.publish("orders", b"keyed %d" % i, ordering_key=f"k{i % 7}")
                for i in range(50)
            ),
            *(orders.publish_many("orders", [b"run"] * 10) for _ in range(5)),
            *(
                orders.publish_many(
                    "orders", [OutgoingMessage(data=b"m", ordering_key=f"k{i}") for i in range(10)]
                )
                for _ in range(5)
            ),
        ]

    failed = await asyncio.gather(*calls(), return_exceptions=True)
    assert all(isinstance(result, streamsub.TopicNotFoundError) for result in failed), failed
    async with streamsub.connect(server.url) as other:
        await other.create_topic("orders", partitions=3)
    stored = await asyncio.gather(*calls())
    ids = [i for result in stored for i in (result if isinstance(result, list) else [result])]
    assert len(ids) == 200
    assert {int(i.split("-", 1)[0]) for i in ids} <= {0, 1, 2}
    assert _stream_total(redis_client, stream_keys(redis_client, "orders", 3)) == 200


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(("name", "text"), BAD_NAMES)
async def test_bad_topic_name(orders: streamsub.Client, name: str, text: str) -> None:
    """Every call that takes a topic name rejects an empty or ill-formed one with
    InvalidArgumentError saying the rule, and writes nothing."""
    match = _literal(text.format(kind="topic"))
    with pytest.raises(streamsub.InvalidArgumentError, match=match):
        await orders.create_topic(name)
    with pytest.raises(streamsub.InvalidArgumentError, match=match):
        await orders.publish(name, b"x")
    with pytest.raises(streamsub.InvalidArgumentError, match=match):
        await orders.publish_many(name, [b"x"])
    with pytest.raises(streamsub.InvalidArgumentError, match=match):
        await orders.get_topic(name)
    with pytest.raises(streamsub.InvalidArgumentError, match=match):
        await orders.delete_topic(name)
    with pytest.raises(streamsub.InvalidArgumentError, match=match):
        await orders.create_subscription("fresh", topic=name)


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(("name", "text"), BAD_NAMES)
async def test_bad_subscription_name(orders: streamsub.Client, name: str, text: str) -> None:
    """Every call that takes a subscription name rejects an empty or ill-formed one with
    InvalidArgumentError saying the rule, and writes nothing."""
    match = _literal(text.format(kind="subscription"))
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: orders.create_subscription(name, topic="orders"),
        lambda: orders.get_subscription(name),
        lambda: orders.delete_subscription(name),
        lambda: orders.subscription_stats(name),
    ]
    for call in calls:
        with pytest.raises(streamsub.InvalidArgumentError, match=match):
            await call()
    with pytest.raises(streamsub.InvalidArgumentError, match=match):
        async with orders.subscribe(name, _never):
            pass


@pytest.mark.usefixtures("unchanged")
async def test_bad_dead_letter_topic_name(orders: streamsub.Client) -> None:
    """An ill-formed dead-letter topic name raises InvalidArgumentError naming it."""
    with pytest.raises(streamsub.InvalidArgumentError, match="invalid dead-letter topic name"):
        await orders.create_subscription("fresh", topic="orders", dead_letter_topic="a b")


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize("name", [None, 7, b"orders"], ids=["None", "int", "bytes"])
async def test_name_not_str(orders: streamsub.Client, name: object) -> None:
    """A topic or subscription name that is not a str raises InvalidTypeError."""
    with pytest.raises(streamsub.InvalidTypeError, match="topic name must be a str"):
        await orders.create_topic(name)  # type: ignore[arg-type]
    with pytest.raises(streamsub.InvalidTypeError, match="topic name must be a str"):
        await orders.publish(name, b"x")  # type: ignore[arg-type]
    with pytest.raises(streamsub.InvalidTypeError, match="subscription name must be a str"):
        await orders.create_subscription(name, topic="orders")  # type: ignore[arg-type]


# --- settings ---------------------------------------------------------------------------
@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("partitions", "error", "text"),
    [
        (0, streamsub.InvalidArgumentError, "partitions must be 1 to 1024, got 0"),
        (1025, streamsub.InvalidArgumentError, "partitions must be 1 to 1024, got 1025"),
        ("16", streamsub.InvalidTypeError, "partitions must be an int, got str"),
        (True, streamsub.InvalidTypeError, "partitions must be an int, got bool"),
    ],
)
async def test_bad_partitions(
    orders: streamsub.Client, partitions: object, error: type[Exception], text: str
) -> None:
    """create_topic with a partition count out of range or not an int raises and writes
    nothing."""
    with pytest.raises(error, match=text):
        await orders.create_topic("fresh", partitions=partitions)  # type: ignore[arg-type]


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("setting", "text"),
    [
        ({"start": "beginning"}, "start must be 'latest' or 'earliest'"),
        ({"ack_deadline": 0}, "ack_deadline must be seconds from 0.01 to 3600"),
        ({"ack_deadline": "30"}, "ack_deadline must be seconds from 0.01 to 3600"),
        ({"max_delivery_attempts": 0}, "max_delivery_attempts must be an int from 1 to 1000"),
        ({"retry_policy": {"minimum_backoff": 1}}, "retry_policy must be a streamsub.RetryPolicy"),
        ({"enable_message_ordering": "yes"}, "enable_message_ordering must be a bool"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else "",
)
async def test_bad_subscription_setting(
    orders: streamsub.Client, setting: dict[str, Any], text: str
) -> None:
    """create_subscription with a setting of the wrong type or range raises
    InvalidArgumentError naming it, and writes nothing."""
    with pytest.raises(streamsub.InvalidArgumentError, match=_literal(text)):
        await orders.create_subscription("fresh", topic="orders", **setting)


@pytest.mark.usefixtures("unchanged")
async def test_bad_subscribe_arguments(orders: streamsub.Client) -> None:
    """subscribe with a handler that is not callable, an unknown ack_mode or a flow_control
    that is not a FlowControl raises at once."""
    with pytest.raises(streamsub.InvalidTypeError, match="handler must be callable"):
        orders.subscribe("billing", "not a function")  # type: ignore[arg-type]
    with pytest.raises(streamsub.InvalidArgumentError, match="ack_mode must be 'auto' or 'manual'"):
        orders.subscribe("billing", _never, ack_mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(
        streamsub.InvalidTypeError, match=r"flow_control must be a streamsub\.FlowControl"
    ):
        orders.subscribe("billing", _never, flow_control={"max_messages": 5})  # type: ignore[arg-type]


def test_malformed_url_is_invalid_argument() -> None:
    """A URL with an unknown scheme is bad input: InvalidArgumentError naming the schemes."""
    with pytest.raises(streamsub.InvalidArgumentError, match="redis://"):
        streamsub.connect("http://localhost:6379/0")


async def _never(message: streamsub.Message) -> None:
    raise AssertionError(f"no message should arrive, got {message!r}")


def _literal(text: str) -> str:
    return re.escape(text)
