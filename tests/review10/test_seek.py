"""Review of issue 10: Seek and snapshots as the official client calls them.

SeekRequest.time: "Messages retained in the subscription that were published
before this time are marked as acknowledged, and messages retained in the
subscription that were published after this time are marked as unacknowledged"
— an operation on what the subscription holds when it runs. CreateSnapshotRequest.name:
"If the name is not provided in the request, the server will assign a random
name for this snapshot on the same project as the subscription".
"""

from __future__ import annotations

from google.cloud import pubsub_v1

from tests.gateway.test_streaming import _setup


def test_create_snapshot_without_a_name_gets_one(
    publisher: pubsub_v1.PublisherClient, subscriber: pubsub_v1.SubscriberClient, project: str
) -> None:
    """Over gRPC a CreateSnapshot with no name is given a random one in the
    subscription's project. The gateway refuses it as an invalid resource name."""
    _, name = _setup(publisher, subscriber, project)
    snapshot = subscriber.create_snapshot(request={"name": "", "subscription": name})
    assert snapshot.name.startswith(f"projects/{project}/snapshots/")
    assert subscriber.get_snapshot(snapshot=snapshot.name).name == snapshot.name
