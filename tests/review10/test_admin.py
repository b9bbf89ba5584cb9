"""Review of issue 10: settings both ways, Update* masks, List* paging.

Issue 10, What to build 1: "settings (ack deadline, dead-letter policy, retry
policy, ordering, exactly-once, retention) both ways". README, Settings both
ways: "an expiration_policy with a ttl (streamsub never expires a subscription;
an empty policy, "never", is accepted)".
"""

from __future__ import annotations

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.protobuf import duration_pb2, field_mask_pb2

from tests.gateway.test_streaming import _setup


def test_a_zero_minimum_backoff_reads_back_as_zero(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """RetryPolicy.minimum_backoff may be 0 ("between 0 and 600 seconds"); what
    CreateSubscription stored, GetSubscription returns. The gateway stores and
    returns 1 ms (streamsub's backoffs must be > 0), so a config round trip
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
    UpdateSubscription refuses the path with INVALID_ARGUMENT."""
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
    INVALID_ARGUMENT. The gateway's token is a bare streamsub name compared with
    '>', so any string is taken and silently filters the listing."""
    for topic in ("alpha", "bravo", "charlie"):
        publisher.create_topic(name=f"projects/{project}/topics/{topic}")
    with pytest.raises(exceptions.InvalidArgument):
        list(
            publisher.list_topics(
                request={"project": f"projects/{project}", "page_token": "not-a-token"}
            )
        )
