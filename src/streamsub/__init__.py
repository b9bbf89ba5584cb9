"""streamsub: reliable pub/sub for Python on Redis Streams.

Topics split into partitions, subscriptions as consumer groups, batched
publishing, streaming receive with flow control and lease management,
ack/nack with retry backoff, and dead-letter topics, with the semantics of
Google Cloud Pub/Sub's high-level client::

    async with streamsub.connect("redis://localhost:6379/0") as client:
        await client.create_topic("orders")
        await client.create_subscription("billing", topic="orders")
        await client.publish("orders", b"...", ordering_key="customer-7")
        async with client.subscribe("billing", handler):
            ...

This file is the whole public API; every other module is private. The layers
below it: ``_core`` (pure bookkeeping, no I/O), ``_engine`` (the asyncio tasks
that drive it), ``_backends`` (storage, where Redis errors become ours).
"""

from ._client import (
    DEFAULT_URL,
    Client,
    PartitionNode,
    Subscriber,
    Subscription,
    SubscriptionStats,
    Topic,
    connect,
)
from ._core.partition import fnv1a_32
from ._core.retention import PartitionTrim, Retention, RetentionResult
from ._core.seek import SeekResult, Snapshot
from ._core.stats import PartitionReport, Stats, SubscriptionReport, TopicReport
from ._engine.deadletters import DeadLetter
from ._engine.receiver import SHUTDOWN_MARGIN, ReceiverStatistics
from ._errors import (
    AckError,
    AckStatus,
    AlreadyExistsError,
    AuthenticationError,
    BackendError,
    CertificateError,
    ClosedError,
    FailedPreconditionError,
    FlowControlLimitError,
    InvalidArgumentError,
    InvalidTypeError,
    MessageTooLargeError,
    NotFoundError,
    OrderingKeyPausedError,
    ResourceExhaustedError,
    StreamsubError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
    UnavailableError,
)
from ._message import Message, OutgoingMessage
from ._settings import (
    BatchSettings,
    Durability,
    FlowControl,
    LimitExceededBehavior,
    Limits,
    PublishFlowControl,
    RetryPolicy,
)

__version__ = "0.1.0"

__all__ = [
    "AckError",
    "AckStatus",
    "AlreadyExistsError",
    "AuthenticationError",
    "BackendError",
    "BatchSettings",
    "CertificateError",
    "Client",
    "ClosedError",
    "DEFAULT_URL",
    "DeadLetter",
    "Durability",
    "FailedPreconditionError",
    "FlowControl",
    "FlowControlLimitError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "LimitExceededBehavior",
    "Limits",
    "Message",
    "MessageTooLargeError",
    "NotFoundError",
    "OrderingKeyPausedError",
    "OutgoingMessage",
    "PartitionNode",
    "PartitionReport",
    "PartitionTrim",
    "PublishFlowControl",
    "ReceiverStatistics",
    "ResourceExhaustedError",
    "Retention",
    "RetentionResult",
    "RetryPolicy",
    "SHUTDOWN_MARGIN",
    "SeekResult",
    "Snapshot",
    "Stats",
    "StreamsubError",
    "Subscriber",
    "Subscription",
    "SubscriptionNotFoundError",
    "SubscriptionReport",
    "SubscriptionStats",
    "Topic",
    "TopicNotFoundError",
    "TopicReport",
    "UnavailableError",
    "__version__",
    "connect",
    "fnv1a_32",
]
