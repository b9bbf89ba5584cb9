"""google.pubsub.v1 message classes: the google-cloud-pubsub package's own.

The raw protobuf classes behind its proto-plus types, which parse and
serialise without a wrapper per field. They are untyped, hence ``Any``.
"""

from __future__ import annotations

import types
from typing import Any

from google.protobuf import empty_pb2
from google.pubsub_v1.types import pubsub as _pubsub

__all__ = ["METHODS", "Empty", "pb"]

_NAMES = (
    "AcknowledgeRequest",
    "CreateSnapshotRequest",
    "DeadLetterPolicy",
    "DeleteSnapshotRequest",
    "DeleteSubscriptionRequest",
    "DeleteTopicRequest",
    "GetSnapshotRequest",
    "GetSubscriptionRequest",
    "GetTopicRequest",
    "ListSnapshotsRequest",
    "ListSnapshotsResponse",
    "ListSubscriptionsRequest",
    "ListSubscriptionsResponse",
    "ListTopicSnapshotsRequest",
    "ListTopicSnapshotsResponse",
    "ListTopicSubscriptionsRequest",
    "ListTopicSubscriptionsResponse",
    "ListTopicsRequest",
    "ListTopicsResponse",
    "ModifyAckDeadlineRequest",
    "PublishRequest",
    "PublishResponse",
    "PubsubMessage",
    "PullRequest",
    "PullResponse",
    "ReceivedMessage",
    "RetryPolicy",
    "SeekRequest",
    "SeekResponse",
    "Snapshot",
    "StreamingPullRequest",
    "StreamingPullResponse",
    "Subscription",
    "Topic",
    "UpdateSnapshotRequest",
    "UpdateSubscriptionRequest",
    "UpdateTopicRequest",
)

pb: Any = types.SimpleNamespace(**{name: getattr(_pubsub, name).pb() for name in _NAMES})
"""``pb.PublishRequest`` and so on: the raw protobuf classes."""
Empty: Any = empty_pb2.Empty

METHODS: dict[str, dict[str, tuple[Any, Any]]] = {
    "google.pubsub.v1.Publisher": {
        "CreateTopic": (pb.Topic, pb.Topic),
        "UpdateTopic": (pb.UpdateTopicRequest, pb.Topic),
        "Publish": (pb.PublishRequest, pb.PublishResponse),
        "GetTopic": (pb.GetTopicRequest, pb.Topic),
        "ListTopics": (pb.ListTopicsRequest, pb.ListTopicsResponse),
        "ListTopicSubscriptions": (
            pb.ListTopicSubscriptionsRequest,
            pb.ListTopicSubscriptionsResponse,
        ),
        "DeleteTopic": (pb.DeleteTopicRequest, Empty),
        "ListTopicSnapshots": (pb.ListTopicSnapshotsRequest, pb.ListTopicSnapshotsResponse),
    },
    "google.pubsub.v1.Subscriber": {
        "CreateSubscription": (pb.Subscription, pb.Subscription),
        "GetSubscription": (pb.GetSubscriptionRequest, pb.Subscription),
        "UpdateSubscription": (pb.UpdateSubscriptionRequest, pb.Subscription),
        "ListSubscriptions": (pb.ListSubscriptionsRequest, pb.ListSubscriptionsResponse),
        "DeleteSubscription": (pb.DeleteSubscriptionRequest, Empty),
        "ModifyAckDeadline": (pb.ModifyAckDeadlineRequest, Empty),
        "Acknowledge": (pb.AcknowledgeRequest, Empty),
        "Pull": (pb.PullRequest, pb.PullResponse),
        "Seek": (pb.SeekRequest, pb.SeekResponse),
        "CreateSnapshot": (pb.CreateSnapshotRequest, pb.Snapshot),
        "GetSnapshot": (pb.GetSnapshotRequest, pb.Snapshot),
        "ListSnapshots": (pb.ListSnapshotsRequest, pb.ListSnapshotsResponse),
        "UpdateSnapshot": (pb.UpdateSnapshotRequest, pb.Snapshot),
        "DeleteSnapshot": (pb.DeleteSnapshotRequest, Empty),
    },
}
"""Unary methods: service -> method -> (request class, response class).
StreamingPull, the one bidirectional method, is served apart."""
