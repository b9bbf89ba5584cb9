"""Review of issue 10: Seek and snapshots as the official client calls them.

SeekRequest.time: "Messages retained in the subscription that were published
before this time are marked as acknowledged, and messages retained in the
subscription that were published after this time are marked as unacknowledged"
— an operation on what the subscription holds when it runs. CreateSnapshotRequest.name:
"If the name is not provided in the request, the server will assign a random
name for this snapshot on the same project as the subscription".
"""

from __future__ import annotations

import datetime
from typing import Any

from google.cloud import pubsub_v1

from tests.gateway.test_streaming import _setup, wait_for


def test_a_seek_to_a_future_time_does_not_swallow_later_messages(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Seeking to a time ahead (how Pub/Sub users purge a backlog; a client clock a
    few seconds fast does the same) acknowledges the backlog; a message published
    after the seek returned is delivered. The gateway's seek moves every partition
    to the future time itself, so everything published during the next hour is
    acknowledged unseen: lost for this subscription."""
    topic, name = _setup(publisher, subscriber, project)
    for future in [publisher.publish(topic, b"backlog %d" % i) for i in range(10)]:
        future.result(timeout=30)
    ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    subscriber.seek(request={"subscription": name, "time": ahead})
    later = publisher.publish(topic, b"published after the seek").result(timeout=30)
    pulled: list[Any] = []

    def pull() -> bool:
        response = subscriber.pull(
            request={"subscription": name, "max_messages": 10, "return_immediately": True}
        )
        pulled.extend(response.received_messages)
        return any(m.message.message_id == later for m in pulled)

    wait_for(pull, 10, "the message published after the seek")
    assert all(m.message.message_id == later for m in pulled)


def test_create_snapshot_without_a_name_gets_one(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Over gRPC a CreateSnapshot with no name is given a random one in the
    subscription's project. The gateway refuses it as an invalid resource name."""
    _, name = _setup(publisher, subscriber, project)
    snapshot = subscriber.create_snapshot(request={"name": "", "subscription": name})
    assert snapshot.name.startswith(f"projects/{project}/snapshots/")
    assert subscriber.get_snapshot(snapshot=snapshot.name).name == snapshot.name
