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
from google.protobuf import field_mask_pb2

from tests.gateway.test_streaming import _setup


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
