"""Topics and subscriptions through the gateway, driven by the official Python client."""

from __future__ import annotations

import asyncio
import time

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.protobuf import duration_pb2, field_mask_pb2

import streamsub
from streamsub.testing import RedisServer

from .test_streaming import _setup


def _native_subscription(server: RedisServer, name: str) -> streamsub.Subscription:
    async def read() -> streamsub.Subscription:
        async with streamsub.connect(server.url) as client:
            return await client.get_subscription(name)

    return asyncio.run(read())


def test_topic_lifecycle(publisher: pubsub_v1.PublisherClient, project: str) -> None:
    """A topic is created, read, listed per project, relabelled and deleted."""
    name = f"projects/{project}/topics/orders"
    created = publisher.create_topic(request={"name": name, "labels": {"team": "billing"}})
    assert created.name == name
    assert dict(created.labels) == {"team": "billing"}
    assert publisher.get_topic(topic=name).name == name
    publisher.create_topic(name=f"projects/{project}/topics/audit")
    publisher.create_topic(name=f"projects/other-{project}/topics/orders")
    listed = [t.name for t in publisher.list_topics(project=f"projects/{project}")]
    assert listed == [f"projects/{project}/topics/audit", name]
    updated = publisher.update_topic(
        request={
            "topic": {"name": name, "labels": {"team": "ops"}},
            "update_mask": field_mask_pb2.FieldMask(paths=["labels"]),
        }
    )
    assert dict(updated.labels) == {"team": "ops"}
    publisher.delete_topic(topic=name)
    with pytest.raises(exceptions.NotFound):
        publisher.get_topic(topic=name)


def test_errors_reach_the_client_as_its_exception_classes(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """ALREADY_EXISTS, NOT_FOUND and INVALID_ARGUMENT arrive as the client's own classes."""
    topic = f"projects/{project}/topics/orders"
    publisher.create_topic(name=topic)
    with pytest.raises(exceptions.AlreadyExists):
        publisher.create_topic(name=topic)
    with pytest.raises(exceptions.NotFound):
        publisher.get_topic(topic=f"projects/{project}/topics/missing")
    with pytest.raises(exceptions.NotFound):
        subscriber.create_subscription(
            name=f"projects/{project}/subscriptions/sub1",
            topic=f"projects/{project}/topics/missing",
        )
    with pytest.raises(exceptions.NotFound):
        subscriber.get_subscription(subscription=f"projects/{project}/subscriptions/none")
    with pytest.raises(exceptions.InvalidArgument):
        publisher.create_topic(name=f"projects/{project}/topics/9starts-with-digit")
    with pytest.raises(exceptions.InvalidArgument):
        publisher.create_topic(name=f"projects/{project}/queues/orders")
    subscriber.create_subscription(name=f"projects/{project}/subscriptions/sub1", topic=topic)
    with pytest.raises(exceptions.AlreadyExists):
        subscriber.create_subscription(name=f"projects/{project}/subscriptions/sub1", topic=topic)
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.create_subscription(
            request={
                "name": f"projects/{project}/subscriptions/sub2",
                "topic": topic,
                "ack_deadline_seconds": 5,
            }
        )


def test_subscription_settings_both_ways(
    publisher: pubsub_v1.PublisherClient,
    subscriber: pubsub_v1.SubscriberClient,
    project: str,
    server: RedisServer,
) -> None:
    """Ack deadline, dead-letter and retry policies, ordering and exactly-once are
    stored as streamsub settings, read back, and updated."""
    topic = f"projects/{project}/topics/orders"
    dead = f"projects/{project}/topics/orders-dead"
    name = f"projects/{project}/subscriptions/billing"
    publisher.create_topic(name=topic)
    publisher.create_topic(name=dead)
    created = subscriber.create_subscription(
        request={
            "name": name,
            "topic": topic,
            "ack_deadline_seconds": 30,
            "dead_letter_policy": {"dead_letter_topic": dead, "max_delivery_attempts": 7},
            "retry_policy": {
                "minimum_backoff": duration_pb2.Duration(seconds=2),
                "maximum_backoff": duration_pb2.Duration(seconds=90),
            },
            "enable_message_ordering": True,
            "enable_exactly_once_delivery": True,
            "labels": {"env": "test"},
        }
    )
    for sub in (created, subscriber.get_subscription(subscription=name)):
        assert sub.topic == topic
        assert sub.ack_deadline_seconds == 30
        assert sub.dead_letter_policy.dead_letter_topic == dead
        assert sub.dead_letter_policy.max_delivery_attempts == 7
        assert sub.retry_policy.minimum_backoff.total_seconds() == 2
        assert sub.retry_policy.maximum_backoff.total_seconds() == 90
        assert sub.enable_message_ordering
        assert sub.enable_exactly_once_delivery
        assert dict(sub.labels) == {"env": "test"}
    native = _native_subscription(server, f"{project}~billing")
    assert native.topic == f"{project}~orders"
    assert native.ack_deadline == 30.0
    assert native.dead_letter_topic == f"{project}~orders-dead"
    assert native.max_delivery_attempts == 7
    assert native.retry_policy == streamsub.RetryPolicy(minimum_backoff=2, maximum_backoff=90)
    assert native.enable_message_ordering
    assert native.enable_exactly_once_delivery

    updated = subscriber.update_subscription(
        request={
            "subscription": {"name": name, "ack_deadline_seconds": 60, "labels": {}},
            "update_mask": field_mask_pb2.FieldMask(
                paths=["ack_deadline_seconds", "dead_letter_policy", "retry_policy", "labels"]
            ),
        }
    )
    assert updated.ack_deadline_seconds == 60
    assert not updated.dead_letter_policy.dead_letter_topic
    assert "retry_policy" not in updated
    assert dict(updated.labels) == {}
    native = _native_subscription(server, f"{project}~billing")
    assert native.ack_deadline == 60.0
    assert native.dead_letter_topic is None
    assert native.retry_policy is None
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.update_subscription(
            request={
                "subscription": {"name": name, "enable_message_ordering": False},
                "update_mask": field_mask_pb2.FieldMask(paths=["enable_message_ordering"]),
            }
        )


def test_subscription_listing_and_deletion(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Subscriptions list per project and per topic, page by page, and are deleted."""
    topic = f"projects/{project}/topics/orders"
    publisher.create_topic(name=topic)
    names = [f"projects/{project}/subscriptions/sub{i}" for i in range(5)]
    for name in names:
        subscriber.create_subscription(name=name, topic=topic)
    pages = subscriber.list_subscriptions(
        request={"project": f"projects/{project}", "page_size": 2}
    )
    assert [s.name for s in pages] == names
    assert list(publisher.list_topic_subscriptions(topic=topic)) == names
    with pytest.raises(exceptions.FailedPrecondition):
        publisher.delete_topic(topic=topic)
    subscriber.delete_subscription(subscription=names[0])
    with pytest.raises(exceptions.NotFound):
        subscriber.delete_subscription(subscription=names[0])
    assert list(publisher.list_topic_subscriptions(topic=topic)) == names[1:]


def test_lowering_the_ack_deadline_keeps_the_leases_already_granted(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """20 messages pulled from an exactly-once subscription and given 300 s more by
    ModifyAckDeadline stay leased when the subscription's ack deadline is lowered
    from 600 s to 60 s: nothing is delivered again, and their acks succeed. The
    gateway redelivers all 20 within seconds (an ack of a first delivery then
    fails: the delivery moved)."""
    topic, name = _setup(
        publisher,
        subscriber,
        project,
        ack_deadline_seconds=600,
        enable_exactly_once_delivery=True,
    )
    for future in [publisher.publish(topic, b"m%d" % i) for i in range(20)]:
        future.result(timeout=30)
    held = []
    while len(held) < 20:
        response = subscriber.pull(subscription=name, max_messages=20)
        assert response.received_messages, f"only {len(held)} of 20 pulled"
        held += response.received_messages
    ack_ids = [m.ack_id for m in held]
    subscriber.modify_ack_deadline(subscription=name, ack_ids=ack_ids, ack_deadline_seconds=300)
    subscriber.update_subscription(
        request={
            "subscription": {"name": name, "ack_deadline_seconds": 60},
            "update_mask": field_mask_pb2.FieldMask(paths=["ack_deadline_seconds"]),
        }
    )
    again = []
    deadline = time.monotonic() + 8  # settings are cached 1 s; sweeps run every 5 s at most
    while time.monotonic() < deadline:
        again += subscriber.pull(subscription=name, max_messages=20).received_messages
    assert not again, f"{len(again)} messages with some 290 s of lease left were delivered again"
    subscriber.acknowledge(subscription=name, ack_ids=ack_ids)


def test_a_zero_minimum_backoff_reads_back_as_zero(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """RetryPolicy.minimum_backoff may be 0 ("between 0 and 600 seconds"); what
    CreateSubscription stored, GetSubscription returns. The gateway used to store
    and return 1 ms (streamsub's backoffs must be > 0), so a config round trip
    (Terraform, a deployment diff) sees a change nobody made."""
    topic = f"projects/{project}/topics/orders"
    name = f"projects/{project}/subscriptions/billing"
    publisher.create_topic(name=topic)
    subscriber.create_subscription(
        request={
            "name": name,
            "topic": topic,
            "retry_policy": {
                "minimum_backoff": duration_pb2.Duration(seconds=0),
                "maximum_backoff": duration_pb2.Duration(seconds=60),
            },
        }
    )
    policy = subscriber.get_subscription(subscription=name).retry_policy
    assert policy.minimum_backoff.total_seconds() == 0
    assert policy.maximum_backoff.total_seconds() == 60


def test_update_to_an_empty_expiration_policy_is_accepted(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """An empty expiration_policy means "never expire", which the README says the
    gateway accepts; Go's client sends exactly this update for
    SubscriptionConfigToUpdate{ExpirationPolicy: time.Duration(0)}. The gateway's
    UpdateSubscription used to refuse the path with INVALID_ARGUMENT."""
    _, name = _setup(publisher, subscriber, project)
    updated = subscriber.update_subscription(
        request={
            "subscription": {"name": name, "expiration_policy": {}},
            "update_mask": field_mask_pb2.FieldMask(paths=["expiration_policy"]),
        }
    )
    assert not updated.expiration_policy.ttl


def test_a_page_token_the_service_never_issued_is_invalid(
    publisher: pubsub_v1.PublisherClient, project: str
) -> None:
    """Google's paging contract (AIP-158): a page_token the service did not issue is
    INVALID_ARGUMENT. The gateway's token used to be a bare streamsub name compared with
    '>', so any string was taken and silently filtered the listing."""
    for topic in ("alpha", "bravo", "charlie"):
        publisher.create_topic(name=f"projects/{project}/topics/{topic}")
    with pytest.raises(exceptions.InvalidArgument):
        list(
            publisher.list_topics(
                request={"project": f"projects/{project}", "page_token": "not-a-token"}
            )
        )
