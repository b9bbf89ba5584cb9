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
