"""Retention settings through the gateway: topic and subscription
message_retention_duration as streamsub's Retention, and trimming of what the
gateway serves."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.protobuf import duration_pb2, field_mask_pb2

import streamsub
from streamsub.testing import RedisServer

from .test_streaming import wait_for


def _native(server: RedisServer, work: Any) -> Any:
    async def run() -> Any:
        async with streamsub.connect(server.url, trim_in_background=False) as client:
            return await work(client)

    return asyncio.run(run())


def _hours(n: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=n * 3600)


def test_topic_retention_is_streamsubs_max_age_both_ways(
    publisher: pubsub_v1.PublisherClient, project: str, server: RedisServer
) -> None:
    """A topic's message_retention_duration is its Retention's max_age: set at
    creation, read back, changed (a length bound set natively stays), cleared,
    and refused outside Pub/Sub's 10 minutes to 31 days."""
    name = f"projects/{project}/topics/orders"
    native = f"{project}~orders"
    created = publisher.create_topic(
        request={"name": name, "message_retention_duration": _hours(1)}
    )
    assert created.message_retention_duration.total_seconds() == 3600
    assert publisher.get_topic(topic=name).message_retention_duration.total_seconds() == 3600
    topic = _native(server, lambda c: c.get_topic(native))
    assert topic.retention == streamsub.Retention(max_age=3600)
    _native(
        server,
        lambda c: c.update_topic_retention(
            native, streamsub.Retention(max_age=3600, max_length=1000)
        ),
    )
    mask = field_mask_pb2.FieldMask(paths=["message_retention_duration"])
    updated = publisher.update_topic(
        request={
            "topic": {"name": name, "message_retention_duration": _hours(2)},
            "update_mask": mask,
        }
    )
    assert updated.message_retention_duration.total_seconds() == 7200
    topic = _native(server, lambda c: c.get_topic(native))
    assert topic.retention == streamsub.Retention(max_age=7200, max_length=1000)
    cleared = publisher.update_topic(request={"topic": {"name": name}, "update_mask": mask})
    assert "message_retention_duration" not in cleared
    topic = _native(server, lambda c: c.get_topic(native))
    assert topic.retention == streamsub.Retention(max_length=1000)
    _native(server, lambda c: c.update_topic_retention(native, streamsub.Retention(max_age=7200)))
    publisher.update_topic(request={"topic": {"name": name}, "update_mask": mask})
    assert _native(server, lambda c: c.get_topic(native)).retention is None
    for seconds in (60, 32 * 86400):
        with pytest.raises(exceptions.InvalidArgument):
            publisher.create_topic(
                request={
                    "name": f"projects/{project}/topics/bad",
                    "message_retention_duration": duration_pb2.Duration(seconds=seconds),
                }
            )
    with pytest.raises(exceptions.InvalidArgument):
        publisher.create_topic(
            request={"name": f"projects/{project}/topics/kms", "kms_key_name": "k"}
        )


def test_subscription_retention_is_the_topics_hard_cap_or_refused(
    publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
    server: RedisServer,
) -> None:
    """Without a hard cap on its topic, a subscription keeps unacked messages until
    acked, so any message_retention_duration is refused; with one (drop_unacked),
    the cap's max_age is reported and is the only value accepted."""
    loose = f"projects/{project}/topics/loose"
    capped = f"projects/{project}/topics/capped"
    publisher.create_topic(request={"name": loose, "message_retention_duration": _hours(1)})
    _native(
        server,
        lambda c: c.create_topic(
            f"{project}~capped",
            retention=streamsub.Retention(max_age=7200, drop_unacked=True),
        ),
    )
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.create_subscription(
            request={
                "name": f"projects/{project}/subscriptions/sub-a",
                "topic": loose,
                "message_retention_duration": _hours(1),
            }
        )
    plain = subscriber.create_subscription(
        name=f"projects/{project}/subscriptions/sub-b", topic=loose
    )
    assert "message_retention_duration" not in plain
    assert plain.topic_message_retention_duration.total_seconds() == 3600
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.create_subscription(
            request={
                "name": f"projects/{project}/subscriptions/sub-c",
                "topic": capped,
                "message_retention_duration": _hours(1),
            }
        )
    made = subscriber.create_subscription(
        request={
            "name": f"projects/{project}/subscriptions/sub-d",
            "topic": capped,
            "message_retention_duration": _hours(2),
        }
    )
    assert made.message_retention_duration.total_seconds() == 7200
    assert made.topic_message_retention_duration.total_seconds() == 7200
    mask = field_mask_pb2.FieldMask(paths=["message_retention_duration"])
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.update_subscription(
            request={
                "subscription": {
                    "name": f"projects/{project}/subscriptions/sub-b",
                    "message_retention_duration": _hours(24),
                },
                "update_mask": mask,
            }
        )
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.create_subscription(
            request={
                "name": f"projects/{project}/subscriptions/sub-e",
                "topic": loose,
                "expiration_policy": {"ttl": _hours(24)},
            }
        )
    never = subscriber.create_subscription(
        request={
            "name": f"projects/{project}/subscriptions/sub-f",
            "topic": loose,
            "expiration_policy": {},
        }
    )
    assert never.name.endswith("/sub-f")


def test_retention_runs_for_subscriptions_pulled_through_the_gateway(
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
    server: RedisServer,
    redis_client: redis.Redis,
) -> None:
    """A topic published by a client that does not trim is kept within its
    retention by the gateway that serves its subscription, once acked."""
    native = f"{project}~orders"

    async def publish(client: streamsub.Client) -> None:
        await client.create_topic(
            native, partitions=4, retention=streamsub.Retention(max_length=10)
        )
        await client.create_subscription(f"{project}~billing", topic=native)
        await client.publish_many(native, [b"m%d" % i for i in range(400)])

    _native(server, publish)
    name = f"projects/{project}/subscriptions/billing"
    acked = 0
    while acked < 400:
        pulled = subscriber.pull(subscription=name, max_messages=100).received_messages
        assert pulled, f"nothing more after {acked}"
        subscriber.acknowledge(subscription=name, ack_ids=[m.ack_id for m in pulled])
        acked += len(pulled)

    def trimmed() -> bool:
        return all(redis_client.xlen(f"ss:{{{native}.{p}}}") <= 10 for p in range(4))

    wait_for(trimmed, 30, "the gateway's trimmer to apply max_length=10")
